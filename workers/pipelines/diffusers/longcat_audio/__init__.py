"""LongCat-AudioDiT: text-to-speech."""
