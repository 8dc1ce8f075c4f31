"""Quantization-aware distillation (QAD): the float model teaches its quantized copy.

:func:`distillation_loss` is the loss of a plain training loop: the KL divergence from the
teacher's token distribution to the student's (softened by ``temperature``, scaled by its
square so that gradients keep their size), optionally mixed with the student's own loss and
:func:`hidden_state_loss` (the mean squared error or 1 - cosine similarity between hidden
states or embeddings). :class:`QADTrainer` is ``transformers.Trainer`` with that loss
(``Trainer.compute_loss`` is the documented place to change it); everything else of the
Trainer (checkpoints, resume, evaluation, distributed) is the Trainer's.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

__all__ = ["QADTrainer", "distillation_loss", "hidden_state_loss"]


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
                      mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``T^2 * KL(softmax(teacher / T) || softmax(student / T))``, summed over the vocabulary
    and averaged over the tokens (those where ``mask`` is true, if given), in float32.

    Args:
        student_logits, teacher_logits: ``(..., vocab)``, the same shape.
        temperature: ``T`` > 0.
        mask: ``(...)`` bool, the tokens that count (for example ``labels != -100``).
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student_logits and teacher_logits must have the same shape, got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    per_token = F.kl_div(s, t, log_target=True, reduction="none").sum(-1)
    if mask is not None:
        if mask.shape != per_token.shape:
            raise ValueError(f"mask must have shape {tuple(per_token.shape)}, got {tuple(mask.shape)}")
        per_token = per_token[mask]
    return per_token.mean() * temperature**2


_HIDDEN_METRICS = ("mse", "cosine")


def _check_metric(name: str, metric: str) -> None:
    if metric not in _HIDDEN_METRICS:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, _HIDDEN_METRICS))}, got {metric!r}")


def hidden_state_loss(student_hidden: Sequence[torch.Tensor], teacher_hidden: Sequence[torch.Tensor],
                      *, metric: str = "mse") -> torch.Tensor:
    """The distance between the student's and the teacher's hidden states (for example
    ``output_hidden_states=True``'s, or sentence embeddings), averaged over the layers, in
    float32; the teacher's are detached.

    Args:
        student_hidden, teacher_hidden: as many tensors each, pairwise of the same shape.
        metric: ``"mse"``, the mean squared error over all elements; or ``"cosine"``, the
            mean over all vectors along the last dimension of ``1 - cosine_similarity``
            (0 for vectors in the same direction, 2 for opposite ones).
    """
    _check_metric("metric", metric)
    if len(student_hidden) != len(teacher_hidden) or not student_hidden:
        raise ValueError(f"student_hidden and teacher_hidden must hold as many (> 0) tensors, got "
                         f"{len(student_hidden)} and {len(teacher_hidden)}")
    if metric == "cosine":
        losses = [(1 - F.cosine_similarity(s.float(), t.detach().float(), dim=-1)).mean()
                  for s, t in zip(student_hidden, teacher_hidden)]
    else:
        losses = [F.mse_loss(s.float(), t.detach().float()) for s, t in zip(student_hidden, teacher_hidden)]
    return torch.stack(losses).mean()


def _build_trainer() -> Any:
    try:
        from transformers import Trainer
    except ImportError as e:  # pragma: no cover (the test extras install transformers)
        raise ImportError("QADTrainer needs transformers (pip install 'fakequant[hf]')") from e

    class QADTrainer(Trainer):
        """``transformers.Trainer`` for quantization-aware distillation: the loss is
        ``kd_weight * distillation_loss(student, teacher, temperature)`` (over the tokens whose
        label is not -100, when labels are given), plus ``(1 - kd_weight)`` times the student's
        own loss when ``kd_weight < 1``, plus ``hidden_weight * hidden_state_loss`` when
        ``hidden_weight > 0`` (with ``hidden_metric``, ``"mse"`` or ``"cosine"``).

        ``QADTrainer(model=quantized, teacher_model=float_model, args=TrainingArguments(...),
        train_dataset=..., temperature=1.0, kd_weight=1.0, hidden_weight=0.0,
        hidden_metric="mse")``; every other argument is the Trainer's. The teacher is put in
        eval mode, frozen, and moved to the training device. (Built on ``transformers.Trainer``
        when first asked for: ``fakequant.models.distill.QADTrainer``; importing fakequant does not
        import transformers.)
        """

        def __init__(self, *args: Any, teacher_model: torch.nn.Module, temperature: float = 1.0,
                     kd_weight: float = 1.0, hidden_weight: float = 0.0, hidden_metric: str = "mse",
                     **kwargs: Any) -> None:
            if not isinstance(teacher_model, torch.nn.Module):
                raise TypeError(f"teacher_model must be a torch.nn.Module, got {type(teacher_model).__name__}")
            for name, value in (("kd_weight", kd_weight), ("hidden_weight", hidden_weight)):
                if not value >= 0:
                    raise ValueError(f"{name} must be >= 0, got {value}")
            _check_metric("hidden_metric", hidden_metric)
            super().__init__(*args, **kwargs)
            self.teacher_model = teacher_model.eval().requires_grad_(False).to(self.args.device)
            self.temperature, self.kd_weight, self.hidden_weight = temperature, kd_weight, hidden_weight
            self.hidden_metric = hidden_metric

        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            hidden = self.hidden_weight > 0
            outputs = model(**inputs, output_hidden_states=hidden)
            with torch.no_grad():
                teacher = self.teacher_model(**inputs, output_hidden_states=hidden)
            labels = inputs.get("labels")
            # (causal LMs: the logit at t predicts the label at t + 1; every token with a label counts)
            mask = None if labels is None else labels != -100
            loss = self.kd_weight * distillation_loss(outputs.logits, teacher.logits, self.temperature, mask)
            if self.kd_weight < 1 and getattr(outputs, "loss", None) is not None:
                loss = loss + (1 - self.kd_weight) * outputs.loss
            if hidden:
                loss = loss + self.hidden_weight * hidden_state_loss(outputs.hidden_states, teacher.hidden_states,
                                                                       metric=self.hidden_metric)
            return (loss, outputs) if return_outputs else loss

    QADTrainer.__module__ = __name__
    return QADTrainer


def __getattr__(name: str) -> Any:
    if name == "QADTrainer":
        cls = _build_trainer()
        globals()["QADTrainer"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
