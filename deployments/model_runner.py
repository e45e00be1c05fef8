"""The model forward pass: pad, run, pool, normalize. Pure torch, no Ray, testable in process."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from transformers import AutoModel, AutoModelForSequenceClassification

from deployments.manifest import ManifestError, ResolvedModel

log = logging.getLogger(__name__)


def pick_device(requested: str) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


class ModelRunner:
    """Holds one model on one device; ``run`` maps unpadded token-id sequences to output rows."""

    def __init__(self, model: ResolvedModel, device: torch.device, pad_id: int) -> None:
        self.model_info = model
        self.task = model.manifest.task
        self.device = device
        self.pad_id = pad_id
        cls = AutoModel if self.task == "embed" else AutoModelForSequenceClassification
        self.model = cls.from_pretrained(str(model.weights_dir)).to(device).eval()
        self._check_loaded()

    def _check_loaded(self) -> None:
        # The weights as loaded, not just their config file, must fit the manifest's output signature.
        config = self.model.config
        m = self.model_info.manifest
        have = config.hidden_size if self.task == "embed" else config.num_labels
        if have != self.model_info.output_size:
            field = "output.dimension" if self.task == "embed" else "output.labels"
            raise ManifestError(field, f"loaded model gives {have}", self.model_info.manifest_path)
        if self.task == "embed" and m.pooling not in ("mean", "cls"):
            raise ManifestError(
                "pooling", f"unsupported pooling {m.pooling!r}", self.model_info.manifest_path
            )

    def run(self, sequences: Sequence[np.ndarray], max_batch: int) -> np.ndarray:
        """Rows in input order. Sequences are length-sorted and cut into micro-batches of at most
        ``max_batch`` so that little compute is spent on padding."""
        n = len(sequences)
        out = np.empty((n, self.model_info.output_size), dtype=np.float32)
        if n == 0:
            return out
        order = np.argsort([len(s) for s in sequences], kind="stable")
        for start in range(0, n, max_batch):
            idx = order[start : start + max_batch]
            out[idx] = self._forward([sequences[i] for i in idx])
        return out

    @torch.inference_mode()
    def _forward(self, seqs: list[np.ndarray]) -> np.ndarray:
        longest = max(len(s) for s in seqs)
        ids = np.full((len(seqs), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(seqs), longest), dtype=np.int64)
        for row, s in enumerate(seqs):
            ids[row, : len(s)] = s
            mask[row, : len(s)] = 1
        input_ids = torch.from_numpy(ids).to(self.device, non_blocking=True)
        attention = torch.from_numpy(mask).to(self.device, non_blocking=True)
        result = self.model(input_ids=input_ids, attention_mask=attention)
        if self.task == "classify":
            values = torch.softmax(result.logits.float(), dim=-1)
        else:
            values = self._pool(result.last_hidden_state.float(), attention)
        return values.cpu().numpy()

    def _pool(self, hidden: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        m = self.model_info.manifest
        if m.pooling == "cls":
            pooled = hidden[:, 0]
        else:  # mean over real tokens only: padded positions carry junk
            weights = attention.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        if m.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled

    def warm_up(self, max_tokens: int, max_batch: int) -> None:
        """Run short and long batches once so the first real request pays no lazy-init cost."""
        short = np.full(4, self.pad_id + 1, dtype=np.int32)
        long = np.full(max_tokens, self.pad_id + 1, dtype=np.int32)
        self.run([short], max_batch)
        self.run([short, long] * max(1, min(max_batch, 8) // 2), max_batch)
        log.info("warm-up done on %s", self.device)
