"""Apache Beam pipelines for the data-parallel tools: pretraining data, vocab, batch inference.

Each pipeline is built from the same pure per-unit functions as the local tool
(a block of one file, a file's word counts, a batch of rows), so a run on the
DirectRunner, on Dataflow or on any other runner writes what the local tool
writes. `apache_beam` is an optional dependency (`pip install -e ".[beam]"`);
nothing else in bert_tf imports this package.
"""
