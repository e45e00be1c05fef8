"""The ONNX Runtime backend: CUDA execution provider where a GPU is present, CPU otherwise. No Ray."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from deployments.repository.manifest import ManifestError, ResolvedModel
from deployments.runtime.runner_base import BatchRunner


def session_options(threads: int | None) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # Spinning intra-op threads take cores from the other replicas that share the machine's cores.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


class OnnxRunner(BatchRunner):
    backend = "onnx"

    def __init__(
        self,
        model: ResolvedModel,
        device: str,
        pad_id: int,
        threads: int | None = None,
    ) -> None:
        super().__init__(model, pad_id)
        available = ort.get_available_providers()
        want_cuda = device in ("auto", "cuda") and "CUDAExecutionProvider" in available and _cuda_usable()
        providers = (
            ["CUDAExecutionProvider", "CPUExecutionProvider"] if want_cuda else ["CPUExecutionProvider"]
        )
        self.session = ort.InferenceSession(
            str(model.onnx_file), session_options(threads), providers=providers
        )
        self._provider = self.session.get_providers()[0]
        self._output = self.session.get_outputs()[0].name
        self._check_loaded()

    @property
    def device_name(self) -> str:
        return "cuda" if self._provider == "CUDAExecutionProvider" else "cpu"

    def _check_loaded(self) -> None:
        names = {i.name for i in self.session.get_inputs()}
        if names != {"input_ids", "attention_mask"}:
            raise ManifestError(
                "format", f"model.onnx inputs are {sorted(names)}", self.model_info.manifest_path
            )
        width = self.session.get_outputs()[0].shape[-1]
        if isinstance(width, int) and width != self.output_size:
            field = "output.dimension" if self.task == "embed" else "output.labels"
            raise ManifestError(field, f"model.onnx gives {width}", self.model_info.manifest_path)

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        (values,) = self.session.run([self._output], {"input_ids": ids, "attention_mask": mask})
        return np.asarray(values, dtype=np.float32)


def _cuda_usable() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
