"""Latency metrics (AL, CW, AP, DAL), shared by the server's live statistics and the evaluation."""
