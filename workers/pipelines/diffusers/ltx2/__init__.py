"""LTX-2: joint video + audio, text-, image- and first/last-frame-to-video."""
