"""Frames of a :class:`~.scene.Scene`, vectorised over frames x rows x columns.

Coordinates are in units of the frame height (x from 0 to the aspect ratio, y from 0 at
the top to 1), so a scene looks the same at any resolution; edges are anti-aliased over
one pixel (``px``: world units per pixel).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from workers.pipelines.procedural.scene import Colour, Scene, Shape


def render(sc: Scene, start: int, stop: int, dev: torch.device) -> torch.Tensor:
    """Frames ``start:stop`` as Tx3xHxW floats in [0, 1]."""
    h, w = sc.height, sc.width
    t = torch.arange(start, stop, device=dev, dtype=torch.float32).view(-1, 1, 1) / sc.fps
    tau = t * sc.motion  # scene time
    zoom = 1 + 0.3 * torch.sin(math.pi * tau / 20) ** 2 if sc.camera == "zoom" else 1 + 0 * tau
    pan = 0.05 * tau if sc.camera == "pan" else 0 * tau
    x, y, px = camera_view(sc, zoom, 0.5, dev)
    if sc.image is not None:
        img, fade = image_frames(sc, x, y, pan, t)  # shapes and grading fade in
    else:
        img, fade = background(sc, x, y, pan, tau, px), torch.ones_like(t)
    for shape in sc.shapes:
        img = draw_shape(img, shape, x, y, tau, px, fade)
    img = img.clamp(0, 1).expand(-1, 3, h, w)
    if sc.grade:
        lum = img.mean(dim=1, keepdim=True)
        graded = (lum + (img - lum) * (1 + sc.grade) - 0.5) * (1 + sc.grade / 2) + 0.5
        img = torch.lerp(img, graded.clamp(0, 1), fade[:, None])
    return img.contiguous()


def camera_view(
    sc: Scene, zoom: torch.Tensor, centre_y: float, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a camera zoomed by ``zoom`` (T×1×1) around ``(aspect / 2, centre_y)`` sees:
    the world coordinates ``x`` (1×1×W per frame) and ``y`` (1×H×1) of every pixel centre,
    in units of the frame height, and the world units per pixel (for anti-aliased edges)."""
    h, w, a = sc.height, sc.width, sc.aspect
    xs = (torch.arange(w, device=dev, dtype=torch.float32).view(1, 1, -1) + 0.5) / h
    ys = (torch.arange(h, device=dev, dtype=torch.float32).view(1, -1, 1) + 0.5) / h
    x = (xs - a / 2) / zoom + a / 2
    y = (ys - centre_y) / zoom + centre_y
    return x, y, 1 / (h * zoom)


def image_frames(
    sc: Scene, x: torch.Tensor, y: torch.Tensor, pan: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference image (``sc.image``) seen through the camera, panned by ``pan``, and
    the fade-in of everything drawn over it (0 at frame 0, so frame 0 is the image)."""
    a = sc.aspect
    assert sc.image is not None
    grid = torch.stack(torch.broadcast_tensors(2 * (x + pan) / a - 1, 2 * y - 1), dim=-1)
    img = F.grid_sample(
        sc.image.expand(len(grid), -1, -1, -1),
        grid,
        mode="bilinear",
        padding_mode="reflection",
        align_corners=False,
    )
    ramp = (t / 0.75).clamp(0, 1)
    return img, ramp * ramp * (3 - 2 * ramp)


def _col(c: Colour, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(c, device=like.device, dtype=torch.float32).view(1, 3, 1, 1)


def _over(img: torch.Tensor, colour: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    return torch.lerp(img, colour, alpha.unsqueeze(1))


def _frac(v: torch.Tensor) -> torch.Tensor:
    return v - torch.floor(v)


def background(
    sc: Scene,
    x: torch.Tensor,
    y: torch.Tensor,
    pan: torch.Tensor,
    tau: torch.Tensor,
    px: torch.Tensor,
) -> torch.Tensor:
    """Sky gradient, stars, sun or moon with glow, terrain (terrain pans faster: parallax)."""
    top, bottom, ground = _col(sc.sky[0], x), _col(sc.sky[1], x), _col(sc.ground, x)
    img = torch.lerp(top, bottom, (y / sc.horizon).clamp(0, 1).unsqueeze(1) ** 0.8)
    far, u = x + 0.15 * pan, x + pan
    if sc.night:
        k = 90.0
        cell = _frac(torch.sin(torch.floor(far * k) * 12.9898 + torch.floor(y * k) * 78.233) * 4e4)
        dist = torch.sqrt((_frac(far * k) - 0.5) ** 2 + (_frac(y * k) - 0.5) ** 2)
        twinkle = 0.6 + 0.4 * torch.sin(3 * tau + cell * 40)
        star = (cell > 0.975) * (y < sc.horizon) * (1 - dist * 4).clamp(0, 1) * twinkle
        img = img + 0.9 * star.unsqueeze(1)
    ox, oy, r, colour, glow = sc.orb
    d = torch.sqrt((far - ox) ** 2 + (y - oy) ** 2)
    orb = _col(colour, x)
    img = img + orb * (glow * torch.exp(-((d / 0.22) ** 2))).unsqueeze(1)
    img = _over(img, 0.5 + 0.5 * orb, (0.5 - (d - r) / px).clamp(0, 1))  # bright disc

    p = sc.terrain_phase
    wave = torch.sin(2.3 * u + p)
    if sc.terrain == "sea":
        height = 0 * u
    elif sc.terrain == "hills":
        height = 0.04 * (1 + wave) + 0.02 * (1 + torch.sin(5.9 * u + 2 * p))
    elif sc.terrain == "forest":
        height = 0.03 + 0.09 * (1 - 2 * (_frac(u * 10 + p) - 0.5).abs()) * (0.8 + 0.2 * wave)
    elif sc.terrain == "mountains":
        height = 0.02 + 0.28 * (1 - 2 * (_frac(0.9 * u + p) - 0.5).abs()) * (0.6 + 0.4 * wave)
    else:  # dunes
        height = 0.04 * (1 + torch.sin(3.1 * u + p)) * (0.6 + 0.4 * wave)
    alpha = (0.5 + (y - sc.horizon + height) / px).clamp(0, 1)
    depth = ((y - sc.horizon) / (1 - sc.horizon)).clamp(0, 1).unsqueeze(1)
    if sc.terrain == "sea":
        ripple = 2 * torch.sin(4 * u + tau)[:, None]
        swell = torch.sin(40 * depth.sqrt() - 1.5 * tau[:, None] + ripple)
        shade = torch.lerp(bottom * 0.85, ground, depth.sqrt()) * (1 + 0.12 * swell)
        glint = torch.exp(-(((far - ox)[:, None] / (0.02 + 0.1 * depth)) ** 2))
        shade = shade + orb * glint * swell.clamp(0, 1) * 0.5 * glow
    else:
        shade = ground * (0.8 + 0.35 * depth)
        if sc.terrain == "mountains":  # snow caps
            snow = ((sc.horizon - y - 0.16) / 0.02).clamp(0, 1).unsqueeze(1)
            shade = torch.lerp(shade, _col((0.92, 0.94, 0.98), x), snow)
    return _over(img, shade, alpha)


def shape_path(s: Shape, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Position (x, y) and rotation of a shape at scene times ``tau``."""
    turn = 2 * math.pi * tau
    if s.path == "bounce":
        x = s.cx + s.ax * torch.sin(0.11 * turn + s.phase)
        y = s.cy - s.ay * torch.sin(0.4 * turn + s.phase).abs()
    elif s.path == "orbit":
        x = s.cx + s.ax * torch.cos(0.2 * turn + s.phase)
        y = s.cy + s.ay * torch.sin(0.2 * turn + s.phase)
    elif s.path == "drift":
        x = s.cx + s.ax * torch.sin(0.07 * turn + s.phase)
        y = s.cy + s.ay * torch.sin(0.4 * turn + s.phase)
    else:  # roll along the ground, turning with the distance travelled
        x = s.cx + s.ax * torch.sin(0.09 * turn + s.phase)
        return x, s.cy + 0 * tau, (x - s.cx) / s.size
    return x, y, s.spin * tau


def draw_shape(
    img: torch.Tensor,
    s: Shape,
    x: torch.Tensor,
    y: torch.Tensor,
    tau: torch.Tensor,
    px: torch.Tensor,
    fade: torch.Tensor,
) -> torch.Tensor:
    """``img`` with shape ``s`` drawn over it at scene times ``tau`` (a contact shadow for
    shapes on the ground), blended by ``fade`` (T, for the fade-in over an image)."""
    sx, sy, angle = shape_path(s, tau)
    dx, dy, r = x - sx, y - sy, s.size
    if s.path in ("bounce", "roll"):  # soft contact shadow, fainter while airborne
        lift = ((s.cy - sy) / max(s.ay, 1e-6)).clamp(0, 1)
        e = (dx / (r * 1.3)) ** 2 + ((y - s.cy - r) / (r * 0.25)) ** 2
        img = img * (1 - ((1 - e).clamp(0, 1) * 0.35 * (1 - 0.6 * lift) * fade).unsqueeze(1))
    colour = _col(s.colour, img)
    if s.kind == "circle":  # shaded ball with a highlight
        alpha = (0.5 - (torch.sqrt(dx**2 + dy**2) - r) / px).clamp(0, 1)
        hl = (torch.sqrt((dx + 0.35 * r) ** 2 + (dy + 0.35 * r) ** 2) / (1.4 * r)).clamp(0, 1)
        fill = colour * (1.25 - 0.55 * hl[:, None]) + 0.35 * (1 - 2.5 * hl[:, None]).clamp(0, 1)
    else:  # rotated box (signed distance), lit from above
        c, si = torch.cos(angle), torch.sin(angle)
        u, v = dx * c + dy * si, dy * c - dx * si
        qx, qy = u.abs() - r * 1.15, v.abs() - r * 0.8
        d = torch.hypot(qx.clamp(min=0), qy.clamp(min=0)) + torch.maximum(qx, qy).clamp(max=0)
        alpha = (0.5 - d / px).clamp(0, 1)
        fill = colour * (1.1 - 0.3 * ((v / r + 0.8) / 1.6).clamp(0, 1)[:, None])
    return _over(img, fill, alpha * fade)
