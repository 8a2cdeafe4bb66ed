"""Why a resume is not exact, and where: the causes of its first difference, each with its evidence, the line of
the user's code where it can be known, and the usual fix. A cause is named only when its evidence holds; where
none does, the cause is unknown and the diagnosis says what was compared.

The evidence is what the runs recorded (recorder.py, watch.py): the rows of both runs (the straight run's row
of step K with its parameters' digests rounded to fp16 and bf16), both runs' model inputs at step K + 1, their
draws from the global RNGs up to step K + 1's update, and every run's saves. It costs nothing more when the
verdict is exact, and is read only here.

  changed outside a step  in a run itself, a step starts from parameters other than those the step before left
  weights restored lossy  the parameters step K + 1 starts from are the straight run's after K rounded to fp16/bf16
  restored from another step  an RNG, the LR or the optimizer state is the straight run's of another step j
  RNG reseeded            a global RNG at K + 1 is where the straight run's was at step 1: right after its seeding
  data position           the samples are the straight run's of another step (replayed, skipped ahead), the same
                          ones in another order, or the same with some elements changed (a random transform)
  scheduler restarted     the LR from K + 1 on is the straight run's from step 1
  optimizer not restored  the optimizer state step K + 1 starts from is empty, or differs only in its step counts
"""

import json
from pathlib import Path

from .recorder import PIECES
from .verdict import NAMES, RNG

CLASSES = {  # class: (title, the usual fix)
    "changed_outside_step": ("The training state changed outside a step",
                             "make the save work on a copy (.clone(), copy.deepcopy) instead of the live tensors"),
    "lossy_weights": ("Weights restored lossy",
                      "save the weights in the dtype they train in: no .half() or .to(torch.bfloat16) on the way "
                      "to the checkpoint"),
    "other_step": ("Restored from another step",
                   "save every piece of the training state at the same step, and load them all from that step's "
                   "checkpoint"),
    "rng_drawn_ahead": ("RNG drawn ahead on resume",
                        "set the RNG states after everything the resume does that draws (building the model, a "
                        "loader skipping batches by iterating them), or give those draws a generator of their own"),
    "rng_reseeded": ("RNG reseeded, not restored",
                     "save the global RNG states (torch.get_rng_state(), np.random.get_state(), random.getstate()) "
                     "in the checkpoint and set them on resume, after any seeding"),
    "data_position": ("Data position",
                      "save where the data is (the step or sample index, the sampler's generator state) and resume "
                      "there; draw random transforms from a generator the checkpoint holds"),
    "scheduler_restarted": ("Scheduler restarted",
                            "save the LR scheduler's state_dict() and load it on resume, or compute the LR from the "
                            "absolute step"),
    "optimizer_not_restored": ("Optimizer state not restored",
                               "save optimizer.state_dict() in the checkpoint and call optimizer.load_state_dict() "
                               "on resume"),
    "unknown": ("Unknown", None),
}


def cause(kind: str, evidence: str, where: str | None = None, **detail) -> dict:
    title, fix = CLASSES[kind]
    return {"class": kind, "title": title, "evidence": evidence, "where": where, "fix": fix, **detail}


def jsonl(folder: Path, pattern: str) -> list:
    rows = []
    for path in sorted(folder.glob(pattern)):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line the kill cut off
                continue
    return rows


def load(path: Path):
    import torch

    return torch.load(path, weights_only=True) if path.exists() else None


def diagnose(v: dict, straight: dict, resumed: dict, out: Path) -> dict | None:
    """{step, rank, causes, compared} of a verdict V that is not exact (None for one that is), from the rows of
    STRAIGHT and RESUMED (as verdict.judge compared them) and what the runs kept under OUT."""
    first = v.get("first")
    if v["exact"] or not first or first["piece"] == "missing":
        return None
    step, rank, k = first["step"], first["rank"], v.get("resumed_from", v["stop_after"])
    s_rows, r_rows = straight.get(rank, {}), resumed.get(rank, {})
    at_cut = k == v["stop_after"] and step == k + 1 and not v.get("again")  # what the runs kept is of step K + 1
    found = Found(v, s_rows, r_rows, step, rank, k, at_cut, Path(out))
    differ = first["pieces"].get(rank, first["pieces"].get(str(rank), []))
    same = [NAMES[p] for p in PIECES if p in s_rows.get(step, {}) and p not in differ and p not in v["not_compared"]]
    found.compared.append(f"step {step}, rank {rank}: " + (f"equal {', '.join(same)}; " if same else "")
                          + f"differ {', '.join(NAMES[p] for p in differ)}")
    for check in (found.changed_outside, found.lossy_weights, found.rngs, found.data, found.lr, found.optimizer):
        try:
            check()
        except Exception as e:  # noqa: BLE001  (a kept file unreadable: that evidence is missing, not wrong)
            found.compared.append(f"{check.__name__}: not compared ({type(e).__name__}: {e})")
    causes = found.causes or [cause("unknown", "nothing compared matched a known cause: " + "; ".join(found.compared))]
    return {"step": step, "rank": rank, "causes": causes, "compared": found.compared}


class Found:
    def __init__(self, v, s_rows, r_rows, step, rank, k, at_cut, out):
        self.v, self.s, self.r, self.step, self.rank, self.k, self.at_cut, self.out = (
            v, s_rows, r_rows, step, rank, k, at_cut, out)
        self.causes, self.compared, self.draw = [], [], None

    def differs(self, piece: str) -> bool:
        a, b = self.s.get(self.step, {}), self.r.get(self.step, {})
        return piece in a and a.get(piece) != b.get(piece)

    # --- the straight run itself -------------------------------------------------------------------------

    def changed_outside(self) -> None:
        self.compared.append("each run's parameters after a step with those its next step started from")
        for name, rows, steps in (("straight", self.s, range(1, self.step)),
                                  ("resumed", self.r, range(self.k + 1, self.step))):
            t = next((t for t in steps if t + 1 in rows and t in rows
                      and rows[t + 1].get("params_in") != rows[t].get("params")), None)
            if t is None:
                continue
            where = self.last_save(name, lambda s, t=t: s.get("step") == t and s.get("where"))
            self.causes.append(cause(
                "changed_outside_step", f"in the {name} run, step {t + 1} started from parameters other than those "
                f"step {t}'s update left: something wrote to the live model between the two steps"
                + (f" (the program saved there: {where})" if where else ""), where, run=name, after_step=t))
            return

    def last_save(self, run: str, chosen) -> str | None:
        """"file:line call" of the last save RUN made (watch.py's saves.<pid>.jsonl) that CHOSEN keeps, where known."""
        saves = [s for s in jsonl(self.out / run, "saves.*.jsonl") if chosen(s)]
        return f"{saves[-1]['where']} {saves[-1]['call']}" if saves and saves[-1].get("where") else None

    # --- the weights ---------------------------------------------------------------------------------------

    def lossy_weights(self) -> None:
        if not (self.at_cut and self.differs("params_in")):
            return
        rounded = self.s.get(self.k, {}).get("params_rounded")
        if not rounded:
            self.compared.append(f"the parameters step {self.step} started from: the straight run's after step "
                                 f"{self.k}, rounded, not recorded")
            return
        self.compared.append(f"the parameters the resumed run's step {self.step} started from with the straight "
                             f"run's after step {self.k}, as they are and rounded to {' and '.join(rounded)}")
        for name, digested in rounded.items():
            if digested == self.r[self.step]["params_in"]:
                where = self.last_save("stopped",
                                       lambda s: s.get("dtypes", {}).get(name) and s.get("step", 0) <= self.k)
                self.causes.append(cause(
                    "lossy_weights", f"every parameter step {self.step} started from equals, bit for bit, the "
                    f"straight run's after step {self.k} rounded to {name}"
                    + (f", and the stopped run saved {name} tensors" if where else ""), where, dtype=name))
                return

    # --- the RNGs ---------------------------------------------------------------------------------------

    def rngs(self) -> None:
        for piece in RNG:
            if piece in self.v["not_compared"] or not self.differs(piece):
                continue
            state = self.r[self.step][piece]
            self.compared.append(f"the resumed run's {NAMES[piece]} state at step {self.step} with the straight "
                                 "run's at every step")
            m = next((m for m in sorted(self.s) if self.s[m].get(piece) == state), None)
            if m is None:
                continue
            j = m - (self.step - self.k)  # the step after which the straight run's generator was where it started
            kind = piece.removeprefix("rng_")
            where = self.first_draw(kind)
            if j == 0:
                self.causes.append(cause(
                    "rng_reseeded", f"the resumed run's {NAMES[piece]} state at step {self.step} is the straight "
                    f"run's at step {m}: where it was right after the program's seeding, not after step {self.k}",
                    where, rng=kind))
            elif j > self.held():
                self.causes.append(cause(
                    "rng_drawn_ahead", f"the resumed run's {NAMES[piece]} state at step {self.step} is the straight "
                    f"run's at step {m}, a state no checkpoint held (the stopped run's last step was {self.held()}): "
                    f"the resumed run drew from it before step {self.step} what the straight run drew by step {m}",
                    where, rng=kind, as_of_step=m))
            elif j != self.k:
                self.causes.append(cause(
                    "other_step", f"the resumed run's {NAMES[piece]} state at step {self.step} is the straight run's "
                    f"at step {m}: restored from after step {j}, not {self.k}", where, piece=piece, from_step=j))
            self.draw = self.draw or where

    def held(self) -> int:
        """The last step whose state a checkpoint could hold: the stopped run's last (the first leg's, --again)."""
        stopped = self.v.get("steps", {}).get("stopped", {})
        return max([last for _, last in stopped.values()] + [self.v.get("again") or 0])

    def first_draw(self, kind: str) -> str | None:
        """The first draw from the global generator KIND, in step K + 1 (both runs' last draws before its update,
        aligned from the end), whose generator state after it differs between the runs: the resumed run's call
        and line."""
        if not self.at_cut:
            return None
        draws = [[d for d in jsonl(self.out / name, "draws.*.jsonl") if d.get("rng") == kind
                  and d.get("rank", 0) == self.rank and d.get("step") == self.k] for name in ("straight", "resumed")]
        n = min(map(len, draws))
        pairs = zip(draws[0][-n:], draws[1][-n:])
        return next((f"{b['where']} {b['call']}" for a, b in pairs if a["after"] != b["after"] and b.get("where")),
                    None) if n else None

    # --- the data ---------------------------------------------------------------------------------------

    def data(self) -> None:
        if not self.differs("samples"):
            return
        samples = self.r[self.step]["samples"]
        self.compared.append(f"the resumed run's samples at step {self.step} with the straight run's at every step")
        m = min((m for m in self.s if m != self.step and self.s[m].get("samples") == samples),
                key=lambda m: abs(m - self.step), default=None)
        if m is not None:
            n = 1
            while self.step + n in self.r and m + n in self.s and \
                    self.r[self.step + n]["samples"] == self.s[m + n].get("samples"):
                n += 1
            how = (f"replayed, {self.step - m} step{'s' * (self.step - m > 1)} behind" if m < self.step
                   else f"skipped ahead, {m - self.step} step{'s' * (m - self.step > 1)}")
            span = f"steps {self.step}..{self.step + n - 1}" if n > 1 else f"step {self.step}"
            other = f"steps {m}..{m + n - 1}" if n > 1 else f"step {m}"
            self.causes.append(cause("data_position", f"the resumed run's samples at {span} are the straight run's "
                                     f"of {other}: {how}", self.draw, how=how.split(",")[0], from_step=m))
            return
        if not self.at_cut:
            return
        theirs, ours = (load(self.out / name / f"rank{self.rank}.inputs_at.pt") for name in ("straight", "resumed"))
        if not theirs or not ours:
            return
        pairs = [(a, b) for x, y in zip(theirs, ours) for a, b in zip(x, y)]
        if len(theirs) != len(ours) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in pairs):
            return
        self.compared.append(f"the model's inputs at step {self.step}, element by element and row by row")
        if all(sorted(map(row_bytes, a)) == sorted(map(row_bytes, b)) for a, b in pairs if a.dim()):
            self.causes.append(cause("data_position", f"the resumed run's samples at step {self.step} are the straight "
                                     "run's, in another order: the shuffle's RNG was not restored", self.draw,
                                     how="another order"))
            return
        changed = sum(int((a != b).sum()) for a, b in pairs)
        total = sum(a.numel() for a, _ in pairs)
        if 0 < changed <= total // 2:
            self.causes.append(cause("data_position", f"the resumed run's samples at step {self.step} differ from the "
                                     f"straight run's in {changed} of {total} elements, the rest equal: a random "
                                     "transform drew other values", self.draw, how="random transform"))

    # --- the LR and the optimizer ---------------------------------------------------------------------------

    def lr(self) -> None:
        if not self.differs("lr"):
            return
        ours = [self.r[t]["lr"] for t in sorted(self.r) if t >= self.step]
        self.compared.append(f"the resumed run's LR from step {self.step} on with the straight run's from each step")
        n = common_prefix(ours, [self.s[t]["lr"] for t in sorted(self.s)])
        if n:
            self.causes.append(cause("scheduler_restarted", f"the resumed run's LR at steps {self.step}.."
                                     f"{self.step + n - 1} is the straight run's at steps 1..{n} "
                                     f"({ours[0][0]:.6g} at step {self.step}, not {self.s[self.step]['lr'][0]:.6g})"))
            return
        m = next((m for m in sorted(self.s) if m != self.step and self.s[m]["lr"] == ours[0]
                  and common_prefix(ours, [self.s[t]["lr"] for t in sorted(self.s) if t >= m]) > 1), None)
        if m is not None:
            self.causes.append(cause("other_step", f"the resumed run's LR from step {self.step} on is the straight "
                                     f"run's from step {m}: the scheduler restored from after step {m - 1}",
                                     piece="lr", from_step=m - 1))

    def optimizer(self) -> None:
        start = self.r.get(min(self.r), {}) if self.r else {}
        after = self.s.get(self.k, {})
        if "optimizer_in" not in start or "optimizer" not in after or start["optimizer_in"] == after["optimizer"]:
            return
        self.compared.append("the optimizer state the resumed run started from with the straight run's after each step")
        if start.get("optimizer_in_empty"):
            self.causes.append(cause("optimizer_not_restored", "the resumed run's first step started from an empty "
                                     f"optimizer state; the straight run's after step {self.k} was not empty"))
        elif after.get("optimizer_moments") and start.get("optimizer_in_moments") == after["optimizer_moments"]:
            self.causes.append(cause("optimizer_not_restored", "the resumed run's optimizer state equals the straight "
                                     f"run's after step {self.k} in everything but its step counts",
                                     how="step counts"))
        else:
            j = next((j for j in sorted(self.s) if self.s[j].get("optimizer") == start["optimizer_in"]), None)
            if j is not None:
                self.causes.append(cause("other_step", f"the optimizer state the resumed run started from is the "
                                         f"straight run's after step {j}, not {self.k}", piece="optimizer",
                                         from_step=j))


def row_bytes(t) -> bytes:
    return t.contiguous().numpy().tobytes()


def common_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
