"""``/v1/webhooks/secret``: the signing secret of the caller's key (docs/webhooks.md).

Every event of a key's jobs (to a request's ``webhook_url`` and to the key's endpoints)
is signed with this secret; with auth off there is one, the server's. It is created on
first use and stored; a rotation makes a new one, and the old one still signs (a second
``v1,`` signature) for ``OMNIQ_WEBHOOKS__ROTATION_GRACE_S``.
"""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentOwner, StateDep
from api.openapi import errors
from models.webhooks import WebhookSecret

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


@router.get("/secret", response_model=WebhookSecret, responses=errors(401))
async def webhook_secret(state: StateDep, owner: CurrentOwner) -> WebhookSecret:
    """The caller's signing secret (``whsec_…``), created on first use."""
    return WebhookSecret(key=await state.blocking(state.webhooks.secret, owner))


@router.post("/secret/rotate", response_model=WebhookSecret, responses=errors(401))
async def rotate_webhook_secret(state: StateDep, owner: CurrentOwner) -> WebhookSecret:
    """A new signing secret for the caller; events are signed with both the new and the
    old one for the grace period, then with the new one only."""
    return WebhookSecret(key=await state.blocking(state.webhooks.rotate, owner))
