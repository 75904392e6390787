"""The files an export folder holds, named once for the code that writes them (export.py, onnx_export.py)
and the code that reads them (predictor.py, onnx_predictor.py), which must not import each other:
the ONNX reader needs the optional onnxruntime, so the predictor imports it only for an ONNX export."""

METADATA_FILE = "bert_tf_export.json"
ONNX_FILE = "model.onnx"
ONNX_FORMAT = "bert_tf ONNX"  # the metadata's "format" of an ONNX export (bert_tf.serving.onnx_export)
