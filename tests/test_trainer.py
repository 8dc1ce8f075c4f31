"""QAT with transformers.Trainer, unchanged: a run stopped at a checkpoint and resumed from it
ends bit for bit where the run without the stop ends; and quantization-aware distillation
(fakequant.distill) from a plain loop and as a Trainer."""
import copy

import pytest
import torch

import fakequant
from fakequant import distill

from conftest import bits_equal

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (the hf extra)")


def _llama(seed=0, initializer_range=0.02):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32, initializer_range=initializer_range))


def _data(n=8, tokens=12):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (n, tokens), generator=g)]


def _args(out, **kwargs):
    settings = dict(output_dir=str(out), per_device_train_batch_size=2, learning_rate=1e-2, max_steps=4,
                    save_strategy="steps", save_steps=2, logging_steps=100, report_to=[], use_cpu=True, seed=0,
                    disable_tqdm=True, dataloader_num_workers=0)
    return transformers.TrainingArguments(**{**settings, **kwargs})


def _quantized():
    model = fakequant.quantize_model(_llama(), preset="INT8")
    fakequant.calibrate(model, [torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))],
                        progress=False)
    return model


def test_trainer_resumes_a_qat_run_bit_for_bit(tmp_path):
    model = _quantized()
    transformers.Trainer(model=model, args=_args(tmp_path / "run"), train_dataset=_data()).train()
    # the same run, stopped after step 2: a new process would load checkpoint-2 and resume
    resumed = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint-2")
    transformers.Trainer(model=resumed, args=_args(tmp_path / "run"), train_dataset=_data()).train(
        resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    a, b = model.state_dict(), resumed.state_dict()
    assert sorted(a) == sorted(b)
    for key in a:
        assert bits_equal(a[key], b[key]), key
    assert any("_amax" in key for key in a)


def test_distillation_loss_is_the_tempered_kl_from_the_teacher():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 5, 11, generator=g), torch.randn(2, 5, 11, generator=g)
    temperature = 2.0
    p = torch.softmax(t / temperature, -1)
    manual = (p * (p.log() - torch.log_softmax(s / temperature, -1))).sum(-1).mean() * temperature**2
    torch.testing.assert_close(distill.distillation_loss(s, t, temperature), manual)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    expected = (p * (p.log() - torch.log_softmax(s / temperature, -1))).sum(-1)[mask].mean() * temperature**2
    torch.testing.assert_close(distill.distillation_loss(s, t, temperature, mask), expected)
    assert float(distill.distillation_loss(t, t)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        distill.distillation_loss(s, t, 0.0)
    with pytest.raises(ValueError, match="same shape"):
        distill.distillation_loss(s, t[:1])


def _kl_to_teacher(student, teacher, data):
    ids = torch.stack([d["input_ids"] for d in data])
    with torch.no_grad():
        return float(distill.distillation_loss(student(ids).logits, teacher(ids).logits))


def test_qad_trainer_brings_the_quantized_student_to_its_float_teacher(tmp_path):
    teacher = _llama(seed=3, initializer_range=0.3).eval()  # peaked logits: a real quantization error
    student = fakequant.quantize_model(copy.deepcopy(teacher), preset="W4A8")
    data = _data()
    before = _kl_to_teacher(student.eval(), teacher, data)
    trainer = distill.QADTrainer(model=student, teacher_model=teacher, args=_args(tmp_path, save_strategy="no", learning_rate=1e-3,
                                                                        max_steps=8),
                                 train_dataset=data, temperature=1.0, kd_weight=0.9, hidden_weight=0.1)
    assert isinstance(trainer, transformers.Trainer)
    trainer.train()
    after = _kl_to_teacher(student.eval(), teacher, data)
    assert after < 0.8 * before, (before, after)
    with pytest.raises(TypeError, match="teacher_model"):
        distill.QADTrainer(model=student, teacher_model="teacher", args=_args(tmp_path))
