"""``OMNIQ_REALTIME__*``: the realtime sessions' group of the one settings object
(:class:`storage.settings.Settings`, which re-exports it)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RealtimeSettings(BaseModel):
    # The first message (session.start) must arrive within this many seconds.
    start_timeout_s: float = 10.0
    max_start_bytes: int = 4 * 1024 * 1024
    # No client message for this long → error "stalled" and close.
    stall_timeout_s: float = 60.0
    # A session waits this long for a worker slot, then gets "resource_exhausted".
    admission_timeout_s: float = 10.0
    # Session slots of one realtime worker process (threads).
    slots: int = 2
    # A world session is admitted while the loads of its model's sessions (device seconds
    # per second of video, from the cost per pixel x step measured by a probe chunk at
    # start-up, capacity_probe, then by every chunk) sum to at most the headroom; a
    # registry entry's max_sessions fixes a count instead (docs/streaming.md).
    capacity_headroom: float = Field(0.9, gt=0, le=1)
    capacity_probe: bool = True
    # Worker ↔ API keep-alives on the session streams, and when silence means "lost".
    keepalive_s: float = 1.0
    lost_after_s: float = 10.0
    # Voice sessions: audio produced ahead of the wall clock since a response started;
    # more lead rides out hiccups, less makes a cancel drop less already-sent audio.
    audio_lead_ms: int = 300
    # World sessions (``WS /v1/realtime/video``): the worker begins a chunk only while at
    # most this many chunks of video are ahead of the client's playback clock (real time
    # from the first chunk), so w/a/s/d reach the screen within a few chunks instead of
    # after a clip buffered in full; 0: unpaced, as fast as the model goes. A session may
    # ask for its own bound with ``extra_params.max_chunks_ahead`` (docs/streaming.md).
    video_lead_chunks: int = Field(2, ge=0, le=10_000)
    # The first audio of a response is sent once this much is made (one burst), so a
    # client that starts playing at the first delta has a cushion against jitter.
    audio_prebuffer_ms: int = 200
    # After the prebuffer, the worker makes at least this much audio per wake-up (its
    # steps back to back) and sends it in one round trip, which the API sends as one
    # delta: fewer wake-ups, Redis messages and client events per second of audio, at
    # the price of deltas this long (0: one step per wake-up).
    audio_chunk_ms: int = Field(120, ge=0, le=1000)
    # Server VAD: the appends of all voice sessions of an API process are scored on one
    # thread, together; the first of a batch waits this long for others to join it
    # (0: no wait; batches hold what arrived meanwhile). Adds at most this to detection.
    vad_batch_ms: float = Field(10.0, ge=0, le=100)
    # Realtime workers: Python's GIL switch interval, how long a session thread woken by
    # Redis may wait for another thread's slice. 5 ms is Python's own default; 1 ms helped
    # video transport before the voice model calls took turns on one lock, and with that
    # lock it made voice first audio later (docs/PERFORMANCE.md).
    switch_interval_ms: float = Field(5.0, gt=0, le=100)
    # A world session's chunk goes to its delivery lane piece by piece as the VAE decodes
    # it, where the model can (SupportsChunkStream: Helios), and is encoded meanwhile: its
    # first frames leave sooner. False: the chunk is decoded whole, then handed over, and
    # its encode runs beside the next chunk's denoise (docs/configuration.md).
    stream_chunk_decode: bool = True
    # Duplex /v1/realtime sessions survive a dropped socket this long (session.resume).
    resume_grace_s: float = 30.0
    # A world session whose model takes snapshots (Helios) stores one with every chunk its
    # worker sends; it outlives its last write this long, so a session can be taken over
    # by another worker when its own dies. Keep it above the longest gap between two chunks
    # plus resume_grace_s + lost_after_s (a session without a socket is taken over only
    # once a client resumes it).
    checkpoint_ttl_s: int = Field(120, gt=0)
    # A realtime worker holds a lease on each session it runs, renewed every keepalive_s
    # by a thread of its own; the API takes a lease that ran out as the worker's death
    # at once, without waiting out lost_after_s (which still covers a worker alive but
    # stuck). 0: no lease (the worker says so in its ``accepted``).
    worker_lease_s: float = Field(3.0, ge=0)
    # The lease names the Redis connection that renews it (its client id), and the API
    # takes that connection gone as the worker's death at once, without waiting out the
    # TTL: a process that dies closes its connections (storage/session_lease.py). Off, or
    # where the server refuses CLIENT or hides connections (a proxy), the TTL alone.
    worker_lease_connection: bool = True
    # How long the Redis-held state of a duplex voice session (replay log, session config,
    # conversation, response state: any API replica resumes it) outlives its last write or
    # keep-alive; longer than resume_grace_s.
    state_ttl_s: int = Field(120, gt=0)
    # Events of a duplex session kept for session.resume (in the API and in Redis).
    replay_events: int = Field(8192, gt=0)
    # The longest realtime session (video and voice), from its start to its end: a video
    # session.start whose rollout (num_frames / fps) is longer is refused, and a live
    # session of either kind is ended with error "session_expired" when it passes this.
    max_session_s: float = Field(600.0, gt=0)
