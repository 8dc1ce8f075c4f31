"""QAT with transformers.Trainer, unchanged: a run stopped at a checkpoint and resumed from it
ends bit for bit where the run without the stop ends; and quantization-aware distillation
(fakequant.models.distill) from a plain loop and as a Trainer."""
import copy

import pytest
import torch

import fakequant
from fakequant.models import distill

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


@pytest.mark.parametrize("shape", [(6, 16), (2, 5, 16), (3, 1, 7)])
def test_hidden_state_loss_cosine_is_one_minus_the_cosine_per_vector(shape):
    g = torch.Generator().manual_seed(0)
    s = [torch.randn(shape, generator=g), torch.randn(shape, generator=g).double()]
    t = [torch.randn(shape, generator=g), torch.randn(shape, generator=g)]
    per_layer = [(1 - (torch.nn.functional.normalize(a.float(), dim=-1)
                       * torch.nn.functional.normalize(b, dim=-1)).sum(-1)).mean() for a, b in zip(s, t)]
    loss = distill.hidden_state_loss(s, t, metric="cosine")
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, torch.stack(per_layer).mean())
    torch.testing.assert_close(distill.hidden_state_loss(t, t, metric="cosine"), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(distill.hidden_state_loss(t, [-x for x in t], metric="cosine"), torch.tensor(2.0))
    torch.testing.assert_close(distill.hidden_state_loss(t, [3 * x for x in t], metric="cosine"), torch.tensor(0.0),
                               atol=1e-6, rtol=0)


def test_hidden_state_loss_mse_by_default_and_no_gradient_into_the_teacher():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(2, 5, 8, generator=g, requires_grad=True)
    t = torch.randn(2, 5, 8, generator=g, requires_grad=True)
    assert bits_equal(distill.hidden_state_loss([s], [t]), torch.nn.functional.mse_loss(s, t.detach()))
    for metric in ("mse", "cosine"):
        s.grad = t.grad = None
        distill.hidden_state_loss([s], [t], metric=metric).backward()
        assert s.grad is not None and s.grad.abs().sum() > 0, metric
        assert t.grad is None, metric
    with pytest.raises(ValueError, match="metric"):
        distill.hidden_state_loss([s], [t], metric="l1")


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
    with pytest.raises(ValueError, match="hidden_metric"):
        distill.QADTrainer(model=student, teacher_model=teacher, args=_args(tmp_path), hidden_metric="l2")


def test_qad_trainer_hidden_metric_is_the_hidden_state_loss_metric(tmp_path):
    teacher = _llama(seed=3, initializer_range=0.3).eval()
    student = fakequant.quantize_model(copy.deepcopy(teacher), preset="W4A8").eval()
    trainer = distill.QADTrainer(model=student, teacher_model=teacher, args=_args(tmp_path, save_strategy="no"),
                                 train_dataset=_data(), hidden_weight=0.5, hidden_metric="cosine")
    ids = torch.stack([d["input_ids"] for d in _data(n=2)])
    with torch.no_grad():
        loss = trainer.compute_loss(student, {"input_ids": ids, "labels": ids})
        s, t = student(ids, output_hidden_states=True), teacher(ids, output_hidden_states=True)
        expected = (distill.distillation_loss(s.logits, t.logits)
                    + 0.5 * distill.hidden_state_loss(s.hidden_states, t.hidden_states, metric="cosine"))
    torch.testing.assert_close(loss, expected)
