"""QAT in four steps with fakequant (the README's snippet, runnable on synthetic data).

    python examples/qat_quickstart.py
"""
import os
import tempfile

import torch
from torch import nn

import fakequant
from fakequant import nn as quant_nn
from fakequant import quant_modules


def build_model():
    # Stands in for any model-building code (torchvision.models.resnet18(), ...).
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


torch.manual_seed(0)
train_loader = [(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))) for _ in range(8)]

# 1a. Drop-in quantized layers where you write the model yourself:
conv = quant_nn.Conv2d(3, 16, 3, padding=1)  # an nn.Conv2d with _input_quantizer / _weight_quantizer

# 1b. Or have torch.nn build quantized layers while a model is constructed:
quant_modules.initialize()
model = build_model()
quant_modules.deactivate()
# (or `with quant_modules.initialize(): model = build_model()`,
#  or fakequant.quantize_model(model) for a model that already exists, e.g. pretrained)

# 2. Calibrate: run a few batches, then every quantizer gets its amax.
fakequant.calibrate(model, train_loader, num_batches=4)

# 3. Fine-tune as usual: fake quantization in the forward, straight-through gradients.
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model.train()
for images, labels in train_loader:
    loss = nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

# 4. Save: the state_dict uses pytorch-quantization's keys (…_input_quantizer._amax, …).
torch.save(model.state_dict(), os.path.join(tempfile.gettempdir(), "qat_quickstart.pth"))
print(f"final loss {loss.item():.3f}; {conv.__class__.__name__} ok;",
      sum(k.endswith("_amax") for k in model.state_dict()), "amax tensors saved")
