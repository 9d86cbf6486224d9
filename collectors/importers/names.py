"""Foreign metric names and the bedside names they are imported under: one default table, overridden by ``--map``.

The table maps the names the common stacks log (Hugging Face's ``train/loss``, Lightning's ``val_loss``,
Megatron's ``lm loss`` and ``grad-norm``, torchtitan's ``loss_metrics/global_avg_loss``, the PyTorch tutorial's
``Loss/train``) to the canonical metrics the detectors read; lookups ignore case. A name in neither the table
nor the map is kept as it is, a user metric. ``--map SRC=DST`` renames ``SRC`` to ``DST`` (taking precedence
over the table); ``--map SRC=`` leaves ``SRC`` out of the import, as Megatron's ``... vs samples`` copies are
by default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..errors import ImportFormatError

_CANONICAL: dict[str, tuple[str, ...]] = {
    "loss": (
        "train/loss",
        "train_loss",
        "training_loss",
        "loss/train",
        "train/lm_loss",
        "lm loss",
        "loss_metrics/global_avg_loss",
    ),
    "grad_norm": ("train/grad_norm", "grad-norm", "grad norm", "gradient_norm", "train/gradient_norm"),
    "lr": ("learning_rate", "train/learning_rate", "train/lr", "learning-rate", "learning rate", "lr-adam", "lr-adamw"),
    "step_time": ("iteration-time",),
    "eval/loss": ("val_loss", "val/loss", "valid/loss", "validation/loss", "validation_loss", "lm loss validation"),
    "eval/ppl": ("lm loss validation ppl",),
}
DEFAULT_NAMES: dict[str, str] = {source: canonical for canonical, sources in _CANONICAL.items() for source in sources}
"""Foreign names (lower case) and the bedside name each is imported under; ``eval/NAME`` is an eval score."""
OTHER_AXES = (" vs samples", " vs tokens")
"""Endings of the copies Megatron-LM's TensorBoard writer logs against another x axis (``lm loss vs samples``, its
step the samples consumed): left out unless ``--map`` names them, since their steps are not training steps."""


class NameMap:
    """The bedside name of each foreign metric name: ``--map`` first, then ``DEFAULT_NAMES``, else unchanged."""

    def __init__(self, mapping: Mapping[str, str] | None = None) -> None:
        self.mapping = dict(mapping or {})

    @classmethod
    def parse(cls, specs: Iterable[str]) -> NameMap:
        """A map from ``SRC=DST`` texts; a name mapped twice, or a text without ``=``, is an error."""
        mapping: dict[str, str] = {}
        for spec in specs:
            source, equals, target = (part.strip() for part in spec.partition("="))
            if not equals or not source:
                raise ImportFormatError(f"--map {spec!r}: expected SRC=DST (or SRC= to leave SRC out)")
            if source in mapping and mapping[source] != target:
                raise ImportFormatError(
                    f"--map: {source} is mapped to two names, {mapping[source] or '(left out)'} and "
                    f"{target or '(left out)'}"
                )
            mapping[source] = target
        return cls(mapping)

    def target(self, name: str) -> str | None:
        """The bedside name of ``name``; None when ``--map`` leaves it out."""
        if name in self.mapping:
            return self.mapping[name] or None
        if name.lower().endswith(OTHER_AXES):
            return None
        return DEFAULT_NAMES.get(name.lower(), name)
