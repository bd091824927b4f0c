"""CogVideoX: text-, image- and video-to-video."""
