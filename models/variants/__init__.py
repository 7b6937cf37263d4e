"""Cross-attention variants of the source papers (GMM, SACT, phrase-based, calibration).

Each module holds one variant's parameters and maths; models/attention.py applies them in
its explicit attention path and models/transformer.py wires them into the decoder layers.
Every variant reduces to standard attention at a known setting (tests/test_attention_variants.py).
"""
