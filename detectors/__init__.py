"""Statistical detectors over run telemetry (numpy, pandas and scipy only)."""
