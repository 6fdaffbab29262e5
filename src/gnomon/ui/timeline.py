"""The run timeline of a job page: one block per run, oldest left, coloured by status,
with a bar above it as tall as the run's start lag (pure; laid out here, drawn as
inline SVG by the template)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WIDTH_PX = 900
LAG_BAND_PX = 60  # the tallest lag bar
BLOCK_TOP_PX = 70
BLOCK_HEIGHT_PX = 22
BLOCK_WIDTH_MAX_PX = 30
GAP_PX = 2
LAG_SCALE_MIN_S = 0.1  # lags under this never fill the band

COLOURS: dict[str, str] = {
    "succeeded": "#2f9e44",
    "failed": "#e03131",
    "running": "#f59f00",
    "staged": "#ffd43b",  # running, granted ahead, waiting for its slot on the worker
    "retry_wait": "#f76707",
    "ready": "#4dabf7",
    "scheduled": "#a5d8ff",
    "cancelled": "#7048e8",
    "skipped": "#adb5bd",
}


@dataclass(frozen=True)
class Block:
    run_id: str
    status: str  # the run's status, or "staged"
    colour: str
    x_px: float
    width_px: float
    lag_s: float | None
    lag_height_px: float
    title: str


@dataclass(frozen=True)
class Timeline:
    blocks: tuple[Block, ...]
    width_px: int
    lag_scale_s: float  # the lag a full-height bar stands for
    lag_p50_s: float | None
    lag_max_s: float | None
    first_slot: str | None
    last_slot: str | None

    @property
    def height_px(self) -> int:
        return BLOCK_TOP_PX + BLOCK_HEIGHT_PX + 4


def kind_of(run: Mapping[str, Any]) -> str:
    status = str(run.get("status"))
    return "staged" if status == "running" and run.get("staged") else status


def layout(runs_newest_first: Sequence[Mapping[str, Any]]) -> Timeline:
    """``runs_newest_first``: run views as ``GET /v1/jobs/{id}/runs`` returns them."""
    runs = list(reversed(runs_newest_first))
    lags = [float(r["startLagS"]) for r in runs if r.get("startLagS") is not None]
    scale_s = max([LAG_SCALE_MIN_S, *lags])
    step_px = min(float(BLOCK_WIDTH_MAX_PX), WIDTH_PX / max(len(runs), 1))
    blocks = []
    for i, run in enumerate(runs):
        kind = kind_of(run)
        lag = None if run.get("startLagS") is None else float(run["startLagS"])
        height = 0.0 if lag is None else max(1.0, LAG_BAND_PX * max(lag, 0.0) / scale_s)
        lag_text = "not started" if lag is None else f"start lag {lag:.3f} s"
        blocks.append(Block(
            run_id=str(run["id"]), status=kind, colour=COLOURS.get(kind, "#868e96"),
            x_px=round(i * step_px, 2), width_px=round(max(step_px - GAP_PX, 1.0), 2), lag_s=lag,
            lag_height_px=round(height, 2), title=f"{run['id']}: {kind}, {lag_text}"))
    return Timeline(
        blocks=tuple(blocks), width_px=WIDTH_PX, lag_scale_s=scale_s,
        lag_p50_s=round(statistics.median(lags), 3) if lags else None,
        lag_max_s=round(max(lags), 3) if lags else None,
        first_slot=str(runs[0]["slot"]) if runs else None, last_slot=str(runs[-1]["slot"]) if runs else None)
