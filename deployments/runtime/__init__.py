"""Where a model runs: backend runners (torch, ONNX Runtime), traced graphs and the ONNX export."""
