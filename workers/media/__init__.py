"""Media in and out: MP4 and fragmented MP4 encoding, pixels, PCM streams, audio files,
spritesheets (PyAV; no torch)."""
