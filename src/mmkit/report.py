"""report.md from the artifacts: every number below is read from a file the workflow made."""

import csv
import math

from .errors import UserError

DIVERGENCE_COLUMNS = [
    "variant", "max_abs_dweight", "rel_l2_dweight", "tensors_differing", "final_train_loss",
    "val_loss", "val_loss_gap", "mean_abs_loss_gap", "max_abs_loss_gap",
]

# what each resumed variant threw away, and why that matters (Korean, as the report)
VARIANTS = {
    "resumed": ("없음 (대조군)", "재개 파일의 모든 상태를 복원했으므로 한 번에 학습한 결과와 비트 단위로 같다."),
    "noopt": (
        "옵티마이저 상태",
        "AdamW는 매개변수마다 두 모멘트(exp_avg, exp_avg_sq)를 기억한다. 이것이 0에서 다시 시작하면 "
        "보폭이 기울기/√(이동평균)으로 다시 정해져, 재개 직후 몇 스텝이 전혀 다른 크기로 움직인다.",
    ),
    "noskip": (
        "배치 생성기 상태",
        "생성기를 처음 시드로 되돌리면 재개 첫 스텝이 1스텝의 배치를 다시 본다. 앞부분은 두 번 보고 "
        "뒷부분은 보지 못한다 — MiniMind의 SkipBatchSampler가 막는 일이다 (nanoGPT의 재개가 이렇다).",
    ),
    "nosched": (
        "스텝 번호 (학습률 일정)",
        "학습률 코사인을 재개 지점에서 0부터 다시 세면, 이미 내려간 학습률이 최고점으로 되돌아가 "
        "재개 직후 큰 보폭으로 움직인다 (torchtitan에 한때 있던 버그).",
    ),
    "halfresume": (
        "가중치의 fp32 정밀도",
        "재개 파일의 가중치를 fp16으로 저장하면(최근 MiniMind의 lm_checkpoint) 반올림 오차가 남고, "
        "옵티마이저와 생성기가 온전해도 결과는 비트 단위로 같지 않다. 차이는 작지만 0이 아니다.",
    ),
    "replay": (
        "에포크 안의 위치",
        "데이터 위치(`data_position`)의 에포크는 지키고 그 안에서 읽은 배치 수를 버리면, 에포크를 첫 배치부터 "
        "다시 읽는다. SkipBatchSampler 없이 DataLoader를 다시 만든 재개가 이렇다. 중단이 에포크 경계에 "
        "떨어지면 버릴 것이 없어 차이도 0이다.",
    ),
    "norng": (
        "전역 난수 상태 (드롭아웃)",
        "드롭아웃 마스크는 전역 RNG에서 뽑힌다. 그 상태(`rng_state`)를 복원하지 않으면 재개한 실행은 새 실행의 "
        "RNG로 마스크를 다시 뽑아, 데이터·옵티마이저가 온전해도 다른 뉴런을 끈다. MiniMind는 RNG 상태를 "
        "저장하지 않는다.",
    ),
    "noscaler": (
        "GradScaler 상태 (fp16)",
        "손실 배율(`scaler`)을 버리면 새 GradScaler가 65536에서 다시 시작한다. 중단 전에 오버플로로 배율이 "
        "내려가 있었다면 재개 직후 몇 스텝이 오버플로로 건너뛰어진다. 배율이 한 번도 움직이지 않았다면 "
        "새 배율도 같은 값이라 차이가 0이다.",
    ),
}
ARCH_NAMES = {"minimind2": "MiniMind2", "minimind3": "MiniMind-3"}


def training_path(env: dict, english: bool = False) -> list[str]:
    """What of MiniMind's own loop the run uses, a phrase each, in Korean or English (none by default)."""
    model, scaler = env["model"], env["scaler"]
    phrases = [
        (env["data_format"] == "minimind",
         "데이터: MiniMind의 PretrainDataset(JSONL 문서, bos/eos/pad, 에포크마다 새 순열, DataLoader)",
         "MiniMind's PretrainDataset JSONL in epoch order through a DataLoader"),
        (env["accumulation_steps"] > 1, f"기울기 누적 {env['accumulation_steps']} 마이크로배치",
         f"{env['accumulation_steps']} micro-batches per step"),
        (model["dropout"], f"드롭아웃 {model['dropout']}", f"dropout {model['dropout']}"),
        (scaler is not None, f"fp16 GradScaler (저장 시 배율 {scaler['scale']:g})" if scaler else "",
         f"fp16 GradScaler (scale {scaler['scale']:g} at the cut)" if scaler else ""),
    ]
    return [en if english else ko for used, ko, en in phrases if used]


def read_loss_log(path) -> dict[int, float]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        return {int(r["step"]): float(r["train_loss"]) for r in rows}
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise UserError(f"loss log {path} is not a step,train_loss CSV ({e})") from None


def read_divergence(path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in DIVERGENCE_COLUMNS[1:]:
            r[k] = float(r[k])
        if "first_step" in r:  # dist/divergence.csv
            r["first_step"] = int(r["first_step"])
    return rows


def tail_lines_equal(straight_log: str, resumed_log: str) -> tuple[int, int]:
    """How many of the resumed log's lines appear, identical as text, in the straight log at the same step."""
    ref = {line.split(",")[0]: line for line in straight_log.splitlines()[1:]}
    lines = resumed_log.splitlines()[1:]
    return sum(ref.get(line.split(",")[0]) == line for line in lines), len(lines)


def decimal_place(x: float) -> str:
    """Which decimal a difference first shows in, in Korean: 0.0022 -> '소수점 셋째 자리'."""
    if x <= 0:
        return "어느 자리도"
    k = max(1, -math.floor(math.log10(x)))
    ordinals = ["첫째", "둘째", "셋째", "넷째", "다섯째", "여섯째", "일곱째", "여덟째"]
    return f"소수점 {ordinals[k - 1] if k <= len(ordinals) else f'{k}번째'} 자리"


def g(x: float) -> str:
    return "0" if x == 0 else f"{x:.3g}" if abs(x) >= 1e-3 else f"{x:.2e}"


def render(env: dict, optim: dict, halves: dict, divergence: list[dict], log_match: tuple[int, int],
           plots: dict, entries: list) -> str:
    """report.md; ENTRIES: the table of the resume file's entries (resume_entries.md, from the resume table)."""
    rows = {r["variant"]: r for r in divergence}
    return "\n".join(overview(env) + what_is_saved(optim, halves["fp16"], rows["resumed"], log_match, entries)
                     + left_out(env, rows, plots) + half_precision(halves["fp16"], halves["bf16"]))


def overview(env: dict) -> list:
    path = training_path(env)  # MiniMind's own loop, where the run uses it
    return [
        "# 중단 후 재개는 한 번에 학습한 것과 같은가 — 재개 파일에 무엇을 넣나",
        "",
        f"{ARCH_NAMES[env['model']['arch']]} 구조 ({env['params']:,} 매개변수: hidden {env['model']['hidden_size']}, "
        f"{env['model']['num_hidden_layers']}층, 헤드 {env['model']['num_attention_heads']}/"
        f"KV {env['model']['num_key_value_heads']}, 어휘 {env['model']['vocab_size']}), 시드 {env['seed']}, "
        f"배치 {env['batch_size']}, 길이 {env['seq_len']}, lr {env['lr']}, 총 {env['steps']} 스텝, "
        f"{env['stop_at']} 스텝에서 중단. 환경: torch {env['torch']}, {env['device']}, 스레드 {env['threads']}, "
        f"정밀도 {env['precision']}, AdamW {env['adamw']}." + (f" {', '.join(path)}." if path else ""),
        "",
        # the machine, then the wall time: the lines of the report that differ between two identical builds
        f"CPU: {env['cpu']}.",
        "",
        f"학습 시간: 학습 작업 {env['jobs']}개의 합계 {env['train_seconds']:.1f}초 "
        f"(가장 긴 작업 {env['longest_job']}: {env['longest_seconds']:.1f}초).",
        "",
    ]


def what_is_saved(optim: dict, fp16: dict, resumed: dict, log_match: tuple[int, int], entries: list) -> list:
    same, total = log_match
    weight_ratio = optim["resume_bytes"] / fp16["fp32_bytes"]
    return [
        "## 무엇을 저장하나",
        "",
        "재개 파일 `resume.pth`에는 다음 스텝이 의존하는 모든 것이 들어 있다. 아래 표는 재개 표"
        "(`mmkit/checkpoint/entries.py`의 `ENTRIES`)와 이 실행의 `resume.pth`에서 생성했다(`resume_entries.md`). "
        "`fingerprint`는 비트 단위 일치에 필요한 설정의 지문(torch 버전, 스레드 수, 장치, 모델 크기 등)이고, "
        "`digests`에는 항목마다 저장 시점의 sha256이 들어 있다.",
        "",
        *entries,
        "",
        "재개하기 전에 모든 항목의 형식·모양·dtype·범위·유한성을 이 실행이 만든 모델과 옵티마이저에 맞춰 "
        "검사한다. `resume.pth.tmp`에 모두 쓰고 fsync한 뒤 `os.replace`로 이름을 바꾸므로, 저장 중에 죽어도 "
        "온전한 파일이 남는다.",
        "",
        f"- 새 프로세스에서 재개한 `resumed.pth`와 `straight.pth`: 최대 |차이| = {g(resumed['max_abs_dweight'])}, "
        f"다른 텐서 {int(resumed['tensors_differing'])}개.",
        f"- `resumed_log.csv`의 {total}줄 중 {same}줄이 `straight_log.csv`의 같은 스텝과 글자 그대로 같다.",
        f"- 가중치 원소 {optim['model_numel']:,}개, 옵티마이저 상태 원소 {optim['optimizer_numel']:,}개: "
        f"배율 **{optim['ratio']:.2f}**. 그래서 재개 파일({optim['resume_bytes']:,} 바이트)은 "
        f"가중치 파일({fp16['fp32_bytes']:,} 바이트)의 {weight_ratio:.2f}배다.",
        "",
    ]


def left_out(env: dict, rows: dict, plots: dict) -> list:
    lines = [
        "## 빠뜨리면",
        "",
        "재개 파일에서 한 가지만 버리거나 망가뜨리고 이어서 학습하면, 오류 없이 다른 모델이 나온다. "
        f"표의 값은 모두 `divergence.csv`에서 왔다 (손실 차는 {env['stop_at']} 스텝 이후의 학습 손실).",
        "",
        "| 변형 | 버린 것 | 최대 \\|Δw\\| | 상대 L2 ‖Δw‖/‖w‖ | 다른 텐서 | 마지막 학습 손실 | 검증 손실 (차) "
        "| 손실 차 평균 / 최대 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        dropped = "— (기준)" if name == "straight" else VARIANTS.get(name, ("?", ""))[0]
        lines.append(
            f"| {name} | {dropped} | {g(row['max_abs_dweight'])} | {g(row['rel_l2_dweight'])} | "
            f"{int(row['tensors_differing'])} | {row['final_train_loss']:.6f} | "
            f"{row['val_loss']:.4f} ({row['val_loss_gap']:+.2g}) | "
            f"{g(row['mean_abs_loss_gap'])} / {g(row['max_abs_loss_gap'])} |"
        )
    lines.append("")
    for name in rows:
        if name in VARIANTS:
            lines.append(f"- **{name}**: {VARIANTS[name][1]}")
    lines += [
        "",
        f"![모든 실행의 학습 손실]({plots['loss']})",
        "",
        f"![중단 이후 straight와의 손실 차 (로그 축)]({plots['gap']})",
    ]
    return lines


def half_precision(fp16: dict, bf16: dict) -> list:
    return [
        "",
        "## 반정밀도",
        "",
        f"`straight.pth`의 모든 텐서를 float16으로 바꿔 `straight_fp16.pth`로 저장했다(임베딩과 lm_head는 "
        f"한 텐서로 묶인 채). 파일 크기 {fp16['fp32_bytes']:,} → **{fp16['fp16_bytes']:,}** 바이트"
        f"({fp16['fp16_bytes'] / fp16['fp32_bytes']:.4f}배, 이름 등 텐서 밖의 내용 때문에 정확히 절반은 아니다). "
        f"fp32 모델에 다시 펼쳐 넣었을 때 검증 토큰 앞 {fp16['tokens']}개의 logits 최대 절대 차이는 "
        f"{g(fp16['max_logit_diff'])}로, {decimal_place(fp16['max_logit_diff'])} 부근이 바뀐다.",
        "",
        "| 형식 | 파일 | 바이트 | fp32 대비 | 최대 \\|Δlogit\\| |",
        "|---|---|---|---|---|",
        f"| fp32 | `straight.pth` | {fp16['fp32_bytes']:,} | 1 | 0 |",
        f"| fp16 | `straight_fp16.pth` | {fp16['fp16_bytes']:,} | {fp16['fp16_bytes'] / fp16['fp32_bytes']:.4f} "
        f"| {g(fp16['max_logit_diff'])} |",
        f"| bf16 | `straight_bf16.pth` | {bf16['bf16_bytes']:,} | {bf16['bf16_bytes'] / bf16['fp32_bytes']:.4f} "
        f"| {g(bf16['max_logit_diff'])} |",
        "",
        "bf16은 fp16보다 지수 범위가 넓지만 가수가 7비트(fp16은 10비트)라서 logits가 "
        + ("더 많이 바뀐다." if bf16["max_logit_diff"] > fp16["max_logit_diff"] else "이번에는 덜 바뀌었다."),
        "",
        "추론용 가중치는 `inference/model.safetensors`(fp16, config.json과 함께 transformers가 바로 읽음)와 "
        "`straight_fp16.pth`이고, 재개용은 `resume.pth`(fp32 가중치+옵티마이저+스텝+생성기 상태)이다 — "
        "반정밀도 가중치에서 재개하면(halfresume) 비트 단위 일치가 깨지므로 두 파일을 따로 둔다.",
        "",
    ]


def render_dist(rows: list[dict] | None, stop_at: int) -> str:
    """The section on several ranks, from dist/divergence.csv (None: dist/ was not built)."""
    lines = ["## 여러 프로세스 (DDP, FSDP2, 리샤딩)", ""]
    if rows is None:
        return "\n".join(lines + [
            "`dist/`를 만들지 않았다: `snakemake --cores 2 dist` (또는 설정 `dist: true`)로 torchrun 2랭크 "
            "비교를 만든다.", ""])
    r = {row["variant"]: row for row in rows}

    def gap(name):
        return f"최대 \\|Δw\\| {g(r[name]['max_abs_dweight'])}, 다른 텐서 {int(r[name]['tensors_differing'])}개"

    rescaled = r["minimind_rescale"]["first_step"] - 1
    lines += [
        "torchrun으로 띄운 2랭크(gloo, CPU) 실행이다. 설계: `batch_size`는 전역 배치이고, 모든 랭크가 "
        "하나의 생성기에서 같은 전역 배치를 뽑아 자기 몫의 연속 조각으로 학습한다. 그래서 데이터 위치는 "
        "랭크 수와 무관한 생성기 상태 하나다. MiniMind는 랭크마다 DistributedSampler로 다른 표본을 읽고, "
        "랭크 수가 바뀌면 `step * saved_ws // current_ws`로 스텝을 다시 계산한다. 전역 배치는 늘 2조각"
        "(`batch_slices`)으로 나뉘고, 1랭크는 두 조각을 손실/2로 누적한다: 2로 나누기는 정확하고 두 항의 "
        "합은 순서에 무관하므로 1랭크와 2랭크가 같은 비트를 만든다.",
        "",
        "| 변형 | 비교 대상 | 첫 스텝 | 최대 \\|Δw\\| | 상대 L2 | 다른 텐서 | 학습 손실 차 평균 / 최대 |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['variant']} | {row['reference']} | {row['first_step']} | {g(row['max_abs_dweight'])} | "
                     f"{g(row['rel_l2_dweight'])} | {int(row['tensors_differing'])} | "
                     f"{g(row['mean_abs_loss_gap'])} / {g(row['max_abs_loss_gap'])} |")
    lines += [
        "",
        f"- **DDP 재개** (`ddp/resumed`): 랭크 0이 배리어 뒤에 재개 파일 하나를 원자적으로 쓰고, 모든 랭크가 "
        f"그것을 읽는다. {gap('ddp/resumed')}.",
        f"- **랭크마다 생성기** (`rank0_gen`): 흔한 DDP 습관대로 랭크마다 `seed + rank` 생성기를 쓰고 랭크 0의 "
        f"상태만 저장하면, 재개 후 모든 랭크가 랭크 0의 배치로 학습한다 — 같은 배치를 두 번 세는 셈이다. "
        f"{gap('rank0_gen/resumed')}, 학습 손실 차 최대 {g(r['rank0_gen/resumed']['max_abs_loss_gap'])}.",
        f"- **FSDP2 재개** (`fsdp2/resumed`): 가중치와 AdamW 상태가 랭크마다 나뉘어 DCP 디렉터리 "
        f"`resume.dcp`에 저장된다(임시 이름으로 쓰고 fsync 후 이름 변경, 파일마다 sha256). {gap('fsdp2/resumed')}.",
        f"- **FSDP2 대 DDP** (`fsdp2/straight`): {gap('fsdp2/straight')}. 기울기 클리핑의 노름을 FSDP2는 "
        "샤드별로 더하고 DDP는 온전한 텐서에서 구하므로 클리핑 계수의 마지막 비트가 다르다. 마지막 비트의 "
        "차이는 AdamW가 기울기를 √(이동평균)으로 나누며 키우므로 스텝마다 커진다: 작은 차이도 비트 단위로 "
        "같다는 보장은 아니다.",
        f"- **2 → 1 랭크** (`reshard_2to1`): {gap('reshard_2to1')}. **1 → 2 랭크** (`reshard_1to2`): "
        f"{gap('reshard_1to2')}. 조각 수가 같으니 합의 순서도 같다. 조각 수를 바꿔 1랭크가 전역 배치를 "
        f"한 번에 학습하면(`reshard_2to1_one_slice`) 기울기의 합 순서가 달라져 비트 일치가 깨진다: "
        f"{gap('reshard_2to1_one_slice')}, 학습 손실 차 최대 {g(r['reshard_2to1_one_slice']['max_abs_loss_gap'])} — "
        "반올림 수준의 표류다. 더 큰 world(예: 4랭크에 4조각)도 all-reduce의 합 순서가 바뀌어 같은 종류의 표류를 낳는다.",
        f"- **DCP 리샤딩** (`fsdp2_to1`): 2랭크 FSDP2의 `resume.dcp`를 한 프로세스로 읽어 이어 학습했다. "
        f"{gap('fsdp2_to1')} — FSDP2 대 DDP와 같은 이유(클리핑 노름의 합 순서)다.",
        f"- **MiniMind의 스텝 재계산** (`minimind_rescale`): 1랭크에서 {stop_at} 스텝에 저장한 파일을 2랭크로 "
        f"이으면 `{stop_at} * 1 // 2 = {rescaled}` 스텝부터 다시 시작하고 데이터 순서도 그 스텝에서 다시 "
        f"만든다. 배치 {stop_at - rescaled}개를 두 번 보고, 학습률 일정도 되감긴다. {gap('minimind_rescale')}, "
        f"학습 손실 차 최대 {g(r['minimind_rescale']['max_abs_loss_gap'])}. 반대로 2랭크 → 1랭크이면 "
        f"`{stop_at} * 2 // 1 = {stop_at * 2}` 스텝이 되어 남은 배치를 건너뛴다.",
        "",
        "GPU(`backend: nccl`, `device: cuda`)도 같은 코드로 돌지만 이 프로젝트에는 GPU가 없어 검증하지 않았다.",
        "",
    ]
    return "\n".join(lines)


def summary_table(env: dict, optim: dict, fp16: dict, divergence: list[dict]) -> str:
    """The README's results table: one row per claim, every value read from an artifact."""
    rows = {r["variant"]: r for r in divergence}
    model, path = env["model"], training_path(env, english=True)
    default = not path and model["arch"] == "minimind2"
    arch = "" if model["arch"] == "minimind2" else f"{ARCH_NAMES[model['arch']]}, "
    lines = [
        f"{'Default run' if default else 'Run'}: {arch}{env['params']:,} parameters, {env['steps']} steps, "
        f"cut at {env['stop_at']}, torch {env['torch']} on {env['device']}, {env['threads']} thread(s), "
        f"{env['precision']}, AdamW {env['adamw']}" + "".join(f"; {part}" for part in path)
        + f". CPU flags: {env['cpu']}.",
        "",
        "| variant | what the resume dropped | max \\|Δw\\| vs straight | rel. L2 Δw | mean / max \\|Δloss\\| after the cut | val loss |",
        "|---|---|---|---|---|---|",
    ]
    dropped = {"resumed": "nothing", "noopt": "optimizer state", "noskip": "data position (generator)",
               "nosched": "step (LR schedule restarted)", "halfresume": "fp32 weights (stored as fp16)",
               "replay": "batches read in this epoch", "norng": "global RNG state (dropout)",
               "noscaler": "GradScaler state (fp16)"}
    for name, row in rows.items():
        if name == "straight":
            lines.append(f"| straight | (no interruption) | — | — | — | {row['val_loss']:.4f} |")
            continue
        lines.append(
            f"| {name} | {dropped.get(name, name)} | {g(row['max_abs_dweight'])} | {g(row['rel_l2_dweight'])} | "
            f"{g(row['mean_abs_loss_gap'])} / {g(row['max_abs_loss_gap'])} | {row['val_loss']:.4f} |"
        )
    lines += [
        "",
        f"| file | bytes | |\n|---|---|---|\n"
        f"| straight.pth (fp32 weights) | {fp16['fp32_bytes']:,} | |\n"
        f"| straight_fp16.pth | {fp16['fp16_bytes']:,} | {fp16['fp16_bytes'] / fp16['fp32_bytes']:.4f} × fp32; "
        f"max \\|Δlogit\\| {g(fp16['max_logit_diff'])} |\n"
        f"| resume.pth (weights + AdamW + step + generator) | {optim['resume_bytes']:,} | "
        f"optimizer/weights elements = {optim['ratio']:.2f} |",
    ]
    return "\n".join(lines) + "\n"


def splice_readme(readme: str, table: str, block: str = "results") -> str:
    """README text with the block between <!-- BLOCK:start --> and <!-- BLOCK:end --> replaced by TABLE."""
    start, end = f"<!-- {block}:start -->", f"<!-- {block}:end -->"
    if start not in readme or end not in readme:
        raise UserError(f"README has no {start} ... {end} block to fill")
    head, rest = readme.split(start, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{start}\n{table}{end}{tail}"
