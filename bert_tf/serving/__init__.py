"""What an exported SavedModel runs: the in-graph tokenizer (tokenizer.py), dynamic int8 dense
layers (quantize.py), and one serving module per task type (module.py says what they share;
encoder.py, classifier.py, span.py, multiple_choice.py, tagging.py). bert_tf/export.py saves them."""
