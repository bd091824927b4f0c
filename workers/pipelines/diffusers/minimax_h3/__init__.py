"""MiniMax-H3 and FastH3: joint video + stereo audio (t2va, fl2va, ref2va)."""
