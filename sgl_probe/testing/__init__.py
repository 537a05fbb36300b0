"""Test helpers for sgl-probe (e.g. ``sgl_probe.testing.receiver.OTLPReceiver``); not used at runtime."""
