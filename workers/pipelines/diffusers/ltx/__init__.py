"""LTX-Video: text-, image-, first/last-frame- and video-to-video."""
