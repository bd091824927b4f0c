"""Tiny random-weight LTX-2 and Stable Audio pipelines, built offline from configs in code.

Sizes follow diffusers' own fast tests (``tests/pipelines/ltx2/testing_utils.py`` and
``tests/pipelines/stable_audio/test_stable_audio.py``, ``get_dummy_components``); the text
encoders get tiny configs here instead of the ``hf-internal-testing`` checkpoints, and the
tokenizers are real ``GemmaTokenizer`` / ``T5Tokenizer`` classes built from a
character-level vocabulary, so nothing is downloaded. Every module is created under a
fixed seed inside ``torch.random.fork_rng`` (same weights every call, global RNG untouched).

Importable by integration tests::

    from tests.unit.diffusers_fixtures_av import tiny_ltx2_pipeline, tiny_stable_audio_pipeline
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any, TypeVar

import torch

_CHARS = list(string.ascii_lowercase + string.digits + ".,'!?-")
_T = TypeVar("_T")

# Requests that fit the tiny models (LTX-2: sizes divisible by 32, VAE compression 2x2x2;
# Stable Audio: at most sample_size * hop_length / sampling_rate = 16 * 2 / 8 = 4 seconds).
LTX2_REQUEST: dict[str, Any] = {"width": 32, "height": 32, "num_frames": 5, "fps": 25.0}
STABLE_AUDIO_REQUEST: dict[str, Any] = {"duration_s": 1.5}


def _seeded(build: Callable[[], _T], seed: int = 0) -> _T:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def tiny_gemma_tokenizer() -> Any:
    """A ``GemmaTokenizer`` over single characters (BPE without merges), left padding."""
    from transformers import GemmaTokenizer

    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "▁"]
    image = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    vocab = {tok: i for i, tok in enumerate(special + _CHARS + image)}
    return GemmaTokenizer(vocab=vocab, merges=[], model_max_length=1024)


def tiny_t5_tokenizer(model_max_length: int = 64) -> Any:
    """A ``T5Tokenizer`` (transformers 5: the fast Unigram one) over single characters and
    word-initial characters."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(c, -3.0) for c in _CHARS] + [("▁" + c, -2.5) for c in _CHARS]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=model_max_length)


def _tiny_gemma3(vocab_size: int) -> Any:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "sliding_window": 64,
            "max_position_embeddings": 2048,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 16,
            "patch_size": 8,
        },
        mm_tokens_per_image=4,
        boi_token_index=vocab_size - 3,
        eoi_token_index=vocab_size - 2,
        image_token_index=vocab_size - 1,
    )
    return Gemma3ForConditionalGeneration(config).eval()


def tiny_ltx2_pipeline(*, timestep_conditioning: bool = False) -> Any:
    """``LTX2Pipeline`` with ~135k random parameters (Gemma3 2 layers x 32, DiT 2 layers).

    ``timestep_conditioning=True`` gives a video VAE that takes a decode timestep, so
    ``__call__`` draws decode noise from the generator after the loop."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    tokenizer = tiny_gemma_tokenizer()
    text_encoder = _seeded(lambda: _tiny_gemma3(len(tokenizer)))
    hidden = text_encoder.config.text_config.hidden_size
    layers = text_encoder.config.text_config.num_hidden_layers
    transformer = _seeded(lambda: LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1,
        num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2,
        qk_norm="rms_norm_across_heads", caption_channels=hidden,
        rope_double_precision=False, rope_type="split",
    ))
    connectors = _seeded(lambda: LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=layers + 1,
        video_connector_num_attention_heads=4, video_connector_attention_head_dim=8,
        video_connector_num_layers=1, video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4, audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32, rope_theta=10000.0, rope_double_precision=False,
        causal_temporal_positioning=False, rope_type="split",
    ))
    vae = _seeded(lambda: AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,),
        decoder_block_out_channels=(8,), layers_per_block=(1,), decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,), decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False), downsample_type=("spatial",),
        upsample_residual=(False,), upsample_factor=(1,),
        timestep_conditioning=timestep_conditioning,
        patch_size=1, patch_size_t=1, encoder_causal=True, decoder_causal=False,
    ))
    audio_vae: Any = _seeded(lambda: AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1,
        attn_resolutions=None, in_channels=2, resolution=32, latent_channels=2,
        norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160,
        is_causal=True, mel_bins=8,
    ))
    vocoder = _seeded(lambda: LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
        hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1, output_sampling_rate=16000,
    ))
    # The shift settings of the released LTX-2 scheduler config (dynamic shifting, mu
    # computed from the video sequence length, terminal shift 0.1).
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
        base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1,
    )
    pipe: Any = LTX2Pipeline(
        scheduler=scheduler, vae=vae, audio_vae=audio_vae, text_encoder=text_encoder,
        tokenizer=tokenizer, connectors=connectors, transformer=transformer, vocoder=vocoder,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_stable_audio_pipeline() -> Any:
    """``StableAudioPipeline`` with ~370k random parameters (stereo, 8 Hz, 4 s max).

    The scheduler is ``EDMDPMSolverMultistepScheduler`` with ``sde-dpmsolver++``, whose
    ``step`` draws noise from the ``generator`` it is given, so the tests also check that
    each job's generator is threaded through its own scheduler steps. (The released
    checkpoint uses ``CosineDPMSolverMultistepScheduler``, which needs ``torchsde``.)
    """
    from diffusers import (
        AutoencoderOobleck,
        EDMDPMSolverMultistepScheduler,
        StableAudioDiTModel,
        StableAudioPipeline,
    )
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel
    from transformers import T5Config, T5EncoderModel

    tokenizer = tiny_t5_tokenizer()
    transformer = _seeded(lambda: StableAudioDiTModel(
        sample_size=16, in_channels=3, num_layers=2, attention_head_dim=4,
        num_key_value_attention_heads=2, out_channels=3, cross_attention_dim=4,
        time_proj_dim=8, global_states_input_dim=8, cross_attention_input_dim=4,
    ))
    scheduler = EDMDPMSolverMultistepScheduler(
        solver_order=2, prediction_type="v_prediction", sigma_data=1.0,
        sigma_schedule="exponential", algorithm_type="sde-dpmsolver++",
    )
    vae = _seeded(lambda: AutoencoderOobleck(
        encoder_hidden_size=6, downsampling_ratios=[1, 2], decoder_channels=3,
        decoder_input_channels=3, audio_channels=2, channel_multiples=[2, 4], sampling_rate=8,
    ))
    t5 = T5Config(
        vocab_size=len(tokenizer), d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16,
        pad_token_id=0, eos_token_id=1,
    )
    text_encoder = _seeded(lambda: T5EncoderModel(t5).eval())
    projection_model = _seeded(lambda: StableAudioProjectionModel(
        text_encoder_dim=t5.d_model, conditioning_dim=4, min_value=0, max_value=32,
    ))
    pipe: Any = StableAudioPipeline(
        vae=vae, text_encoder=text_encoder, projection_model=projection_model,
        tokenizer=tokenizer, transformer=transformer, scheduler=scheduler,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe
