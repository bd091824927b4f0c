"""Wan 2.1 / 2.2: text-, image-, first/last-frame- and video-to-video."""
