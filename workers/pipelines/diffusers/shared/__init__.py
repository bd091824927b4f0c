"""What the diffusers families share: the adapter base (``common``), loading, compiled
blocks, cache tiers, LoRA, keyframes, packed latents and random weights."""
