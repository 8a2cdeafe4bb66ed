"""The two pictures of the report: every run's loss, and how far each resumed variant drifts."""

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "straight": dict(color="black", lw=2.5, label="straight (60 steps in one process)"),
    "resume": dict(color="grey", lw=1, ls=":", label="resume (stopped at the cut)"),
    "resumed": dict(color="tab:green", lw=1.5, ls="--", zorder=5, label="resumed (full resume file)"),
    "noopt": dict(color="tab:red", lw=1.2, label="noopt (optimizer state dropped)"),
    "noskip": dict(color="tab:orange", lw=1.2, label="noskip (batch generator re-seeded)"),
    "nosched": dict(color="tab:purple", lw=1.2, label="nosched (LR schedule restarted)"),
    "halfresume": dict(color="tab:blue", lw=1.2, label="halfresume (fp16 weights in the resume file)"),
    "replay": dict(color="tab:brown", lw=1.2, label="replay (the epoch read again from its first batch)"),
    "norng": dict(color="tab:olive", lw=1.2, label="norng (dropout's RNG state dropped)"),
    "noscaler": dict(color="tab:cyan", lw=1.2, label="noscaler (a fresh GradScaler)"),
}


def plot_losses(losses: dict[str, dict[int, float]], stop_at: int, path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, log in losses.items():
        ax.plot(list(log), list(log.values()), **STYLE.get(name, dict(label=name)))
    ax.axvline(stop_at, color="grey", ls="--", lw=0.8)
    ax.text(stop_at, ax.get_ylim()[0], f" cut at step {stop_at}", va="bottom", fontsize=8, color="grey")
    ax.set(xlabel="optimizer step", ylabel="train loss (nats/token)", title="Train loss of every run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def plot_gaps(losses: dict[str, dict[int, float]], stop_at: int, path) -> None:
    ref = losses["straight"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    exact = []
    for name, log in losses.items():
        if name in ("straight", "resume"):
            continue
        steps = [s for s in log if s > stop_at]
        gaps = [abs(log[s] - ref[s]) for s in steps]
        if not any(gaps):
            exact.append(name)  # zero everywhere has no point on a log axis
            continue
        ax.semilogy(steps, [g if g > 0 else float("nan") for g in gaps], marker=".", **STYLE.get(name, {"label": name}))
    if exact:
        ax.text(0.02, 0.02, f"{', '.join(exact)}: exactly 0 at every step", transform=ax.transAxes, fontsize=9)
    ax.set(xlabel="optimizer step", ylabel="|loss − straight loss| (nats/token)",
           title=f"How far each resumed run drifts after the cut at step {stop_at}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


AUDIT_COLOURS = {"exact": "#4caf50", "repaired": "#ffb300", "unknown": "#e53935", "failed": "#757575",
                 "crash": "#8e24aa", "unsupported": "#ffffff"}


def verdict_map(ax, grid: list[list[str]], rows: list, columns: list, text: list | None = None) -> None:
    """A heat map of verdicts on AX: ROWS by COLUMNS, each cell coloured by its verdict and named (by TEXT,
    a grid of the same shape, where given)."""
    from matplotlib.colors import ListedColormap

    names = list(AUDIT_COLOURS)
    ax.imshow([[names.index(v) for v in row] for row in grid], cmap=ListedColormap(list(AUDIT_COLOURS.values())),
              vmin=0, vmax=len(names) - 1, aspect="auto")
    for i, row in enumerate(text or grid):
        for j, v in enumerate(row):
            ax.text(j, i, v, ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)


def plot_audit(grid: list[list[str]], frameworks: list, scenarios: list, path) -> None:
    """The audit matrix as a heat map: frameworks by scenarios, each cell coloured by its verdict."""
    fig, ax = plt.subplots(figsize=(1.3 * len(scenarios) + 2, 0.6 * len(frameworks) + 1.6))
    verdict_map(ax, grid, frameworks, scenarios)
    ax.set_title("Resumed vs straight, bit for bit (repaired: exact once the named piece is restored by hand)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def plot_releases(panels: list, path) -> None:
    """The audit across releases: a panel per framework (PANELS: (framework, grid, text, scenarios, releases)),
    releases across and scenarios down, each cell coloured by its verdict and named by its TEXT."""
    width = max(len(releases) for *_, releases in panels)
    heights = [len(scenarios) + 2.2 for *_, scenarios, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(1.5 * width + 2.5, 0.45 * sum(heights) + 0.6),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (framework, grid, text, scenarios, releases) in zip(axes[:, 0], panels):
        verdict_map(ax, grid, scenarios, releases, text)
        ax.set_title(framework, fontsize=9, loc="left")
    fig.suptitle("Resumed vs straight, bit for bit, release by release (oldest left)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
