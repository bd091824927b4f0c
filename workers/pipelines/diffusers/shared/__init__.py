"""What the diffusers families share: the adapter base (``adapter``), the helpers its
families' steps call (``common``), what a registry entry configures (``entry``), loading,
compiled blocks, cache tiers, LoRA, keyframes, packed latents and random weights."""
