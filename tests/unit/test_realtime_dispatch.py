"""The event → handler table of ``WS /v1/realtime`` (``realtime.audio_protocol.HANDLERS``)
is the whole dispatch: one handler per client event type, none left out, none unused."""

from __future__ import annotations

import models.realtime as wire
from realtime.audio_protocol import HANDLERS, VoiceSessionProtocol


def test_every_client_event_has_exactly_one_handler() -> None:
    assert sorted(HANDLERS) == sorted(wire.CLIENT_EVENTS)
    assert len(set(HANDLERS.values())) == len(HANDLERS)


def test_no_handler_is_outside_the_table() -> None:
    """A handler method no event reaches would be dead code (the old ``_on_<type>``
    naming made one easy to leave behind)."""
    defined = {
        getattr(VoiceSessionProtocol, name)
        for name in dir(VoiceSessionProtocol)
        if name.startswith("_on_")
    }
    assert defined == set(HANDLERS.values())
