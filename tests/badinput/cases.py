"""The bad-input cases of meshlm (run by run_cases.py; one ctest each, label
`badinput`, registered by tests/badinput.cmake).

A case is plain data: its work directory's files (setup steps of gen.py, run
in order, then `before`: meshlm commands whose results the case starts
from), the meshlm command (run with cwd = the work directory under mpiexec
-n RANKS), what must happen (expect "fail": non-zero exit; "ok": exit 0;
"one_ok": of `concurrent` identical runs started together exactly one
succeeds), the regex the output must match (the key or the file the message
names) and `forbid`, the regex it must not match (by default: a crash or
a bare bad_alloc), `max_output` (bytes), the time bound in seconds (a hang
is a failure), and the paths under which files may change
(`may_change`; none for rejected input: the whole work directory is hashed
before and after and must be identical).

Groups: param_file, command_line, tokens, safetensors (and the other base
weights, meshlm HDF5), cache (quant.cache), output_dir.

PENDING names the cases that express the correct behaviour of something
meshlm gets wrong today (the "safe by default" issue); run_cases.py reports
them as skipped with the reason and does not run them. Remove a case from
PENDING when the fix lands (`run_cases.py --run-pending NAME` shows whether
it passes).
"""
from dataclasses import dataclass, field
import re
from typing import Callable, Optional

import gen
from gen import (blob, cfg, fifo, fixture, flip_byte, mkdir, raw_cfg, raw_tokens, h5_tokens,
                 safetensors, params_h5, cache_edit, set_attr, symlink, tokens, truncate)

# ---------------------------------------------------------------------------
# PENDING: wrong today, to be fixed in src/ (issue "safe by default").
# ---------------------------------------------------------------------------

CACHE_CLOBBER = ("quant.cache pointed at an existing non-cache file is replaced "
                 "(must: error naming quant.cache and the file, file unchanged)")
TOKENIZE_SAME = "meshlm tokenize X X replaces its input (must: refuse, same file)"
SECOND_RUN = ("a second run into the same output.dir silently replaces run.h5 (must: error "
              "unless output.overwrite = true or checkpoint.resume)")
CONCURRENT = "two runs at once into one output.dir"
NAN_BASE = "NaN in a base weight (safetensors) under LoRA/NF4 and in full mode must be an error naming the tensor"
NONFINITE_KEY = ("train.eps = inf, NaN/inf in train.lr, beta1, beta2, weight_decay, "
                 "finetune.lora_alpha, grad_clip etc. must be rejected at parse time naming the key")
SEED = "train.seed = -1 must be rejected"
FAIL_RANK = "debug.fail_rank >= world size must be rejected"
THREADS = "runtime.threads = 100000 must be rejected (bound)"
FIFO_DATA = "data.path naming a FIFO must be refused quickly naming data.path"
N_LAYER = "model.n_layer = 100000 must fail fast"
MEMORY = "a model far beyond memory must be refused before allocating"
HUGE_KEYS = ("vocab_size = 2147483647, n_embd = 1073741824, batch_size = 2147483646 must be "
             "errors naming the keys (no wrap-around, no bare bad_alloc)")
DATA_PATH_DIR = "data.path that is a directory must name data.path (not \"data.path is required\")"
DATA_PATH_NAME = ("a 10,000-character path or a symlink loop must be reported against data.path "
                  "(not data.tokenize_from)")
LATE_IDS = "token ids out of range anywhere in the file must be found before anything is written (no run.h5 left behind)"
NEW = "new finding"

# Every case the "safe by default" work set out to fix passes now; a case
# that expresses a behaviour still to be fixed goes here, with its reason.
PENDING = {}


# ---------------------------------------------------------------------------
# The case type
# ---------------------------------------------------------------------------

GROUPS = ("param_file", "command_line", "tokens", "safetensors", "cache", "output_dir")


@dataclass
class Case:
    name: str
    group: str
    args: list                       # meshlm arguments
    regex: str                       # must match the output (re.search)
    setup: list = field(default_factory=list)
    expect: str = "fail"             # fail | ok | one_ok
    ranks: int = 2
    timeout: float = 30.0            # seconds; longer is a hang
    forbid: Optional[str] = None     # must not match the output
    may_change: tuple = ()           # paths (and what is below them) allowed to change
    must_exist: tuple = ()           # paths that must exist afterwards
    post: Optional[Callable] = None  # post(work, runner) -> None or what is wrong
    before: list = field(default_factory=list)  # [(ranks, args)] run before the snapshot
    concurrent: int = 1
    max_output: Optional[int] = None  # bytes of output at most (a message must not quote a huge input)
    doc: str = ""


CASES = []

# Errors every rejected case forbids: a crash or an allocation failure is
# not an error message.
CRASH = r"bad_alloc|Segmentation fault|signal 11|Aborted \(signal 6\)|terminate called"


def add(name, group, args, regex, **kw):
    kw.setdefault("forbid", CRASH if kw.get("expect", "fail") == "fail" else None)
    CASES.append(Case(name, group, list(args), regex, **kw))


def check_table():
    """Problems of the table itself: duplicate names, unknown groups,
    PENDING entries that name no case."""
    problems, seen = [], set()
    for c in CASES:
        if c.name in seen:
            problems.append("duplicate case %s" % c.name)
        seen.add(c.name)
        if c.group not in GROUPS:
            problems.append("case %s: unknown group %s" % (c.name, c.group))
        if not re.fullmatch(r"[a-z0-9_]+", c.name):
            problems.append("case %s: names are [a-z0-9_]" % c.name)
    for n in PENDING:
        if n not in seen:
            problems.append("PENDING names no case: %s" % n)
    return problems


TRAIN = ["train", "run.cfg"]
STD = [tokens(), cfg()]  # a valid run: tokens.h5 and run.cfg (two steps into out/)
OUT_OK = dict(expect="ok", may_change=("out",), must_exist=("out/run.h5",))


# ---------------------------------------------------------------------------
# param_file: every section of the parameter file
# ---------------------------------------------------------------------------

def P(name, regex, set=None, text=None, args=(), **kw):
    """A parameter-file case: run.cfg is config_text(set=...) or `text`."""
    setup = [tokens(), raw_cfg(text) if text is not None else cfg(set=set)]
    add(name, "param_file", TRAIN + list(args), regex, setup=setup + kw.pop("setup", []), **kw)


base = gen.config_text()

# Syntax and structure
P("unknown_key", r"run\.cfg: unknown key 'model\.n_layers'", set={"model.n_layers": "2"})
P("unknown_section", r"run\.cfg: unknown key 'modle\.n_layer'", text=base + "[modle]\nn_layer = 2\n")
P("key_before_first_section", r"run\.cfg: unknown key 'n_layer'", text="n_layer = 2\n" + base)
P("key_upper_case", r"run\.cfg: unknown key 'model\.N_LAYER'", set={"model.N_LAYER": "2"})
P("duplicate_key_in_section", r"model\.n_layer",
  text=base.replace("n_layer = 2\n", "n_layer = 2\nn_layer = 3\n"))
P("duplicate_key_under_an_override", r"run\.cfg: key 'model\.n_layer' is given twice",
  text=base.replace("n_layer = 2\n", "n_layer = 2\nn_layer = 3\n"), args=["--model.n_layer=2"],
  doc="a key given twice in the file is an error even where the command line overrides it")
P("empty_bool", r"run\.cfg: data\.shuffle has an empty value: give true or false",
  text=base + "[data]\nshuffle =\n",
  doc="an empty value of a bool key is no value, not true (program_options' reading)")
P("line_without_equals", r"run\.cfg", text=base.replace("n_layer = 2", "n_layer 2"))
P("unterminated_section_header", r"run\.cfg", text=base.replace("[train]", "[train"))
P("very_long_key", r"run\.cfg: unknown key 'model\.x{20}", text=base + "[model]\n" + "x" * 100000 + " = 1\n")
P("garbage_bytes", r"run\.cfg",
  text=bytes((i * 151 + 7) % 256 for i in range(4096)))
P("binary_file_as_parameter_file", r"run\.cfg",
  setup=[fixture("tokens.h5", "run.cfg")], text=None,
  doc="an HDF5 token file given as the parameter file")
P("file_value_is_a_message_token", r"model\.n_layer", text=base.replace("n_layer = 2", "n_layer = %value%"))
P("nul_byte_in_value", r"run\.cfg: line \d+ holds the byte \\x00", text=base.replace("n_layer = 2", "n_layer = 2\x003"))
P("huge_parameter_file", r"run\.cfg", setup=[gen.huge_cfg("run.cfg", base + "[model]\n", 16 << 20)],
  timeout=60, doc="16 MiB of one line that is no key = value")
P("huge_line_message_is_bounded", r"run\.cfg", setup=[gen.huge_cfg("run.cfg", base + "[model]\n", 16 << 20)],
  timeout=60, max_output=64 << 10, doc="the error about a 16 MiB line does not print the line")
P("garbage_bytes_message_is_text", r"run\.cfg", text=bytes((i * 151 + 7) % 256 for i in range(4096)),
  forbid="\ufffd|" + CRASH, doc="the error about binary garbage is printable UTF-8 (no raw bytes)")
P("empty_parameter_file", r"data\.path is required", text="")
P("no_model_section_defaults", r"# run log: out/run\.h5",
  text=gen.config_text(drop_sections=("model",)), **OUT_OK,
  doc="a missing section takes the defaults of meshlm train --help")
P("comments_and_inline_comments", r"# run log: out/run\.h5",
  text="# a comment\n\n" + base.replace("n_layer = 2", "n_layer = 2   # two blocks"), **OUT_OK)

# [model]
P("n_layer_text", r"model\.n_layer", set={"model.n_layer": "two"})
P("n_layer_empty", r"model\.n_layer", set={"model.n_layer": ""})
P("n_layer_negative", r"model\.n_layer = \-1: must lie in", set={"model.n_layer": "-1"})
P("n_head_zero", r"model\.n_head = 0: must lie in", set={"model.n_head": "0"})
P("n_embd_not_divisible", r"model\.n_embd \(33\) must be divisible by model\.n_head \(2\)",
  set={"model.n_embd": "33"})
P("vocab_size_one", r"model\.vocab_size = 1: must lie in", set={"model.vocab_size": "1"})
P("seq_len_zero", r"model\.seq_len = 0: must lie in", set={"model.seq_len": "0"})
P("seq_len_beyond_max", r"model\.seq_len \(33\) is longer than the position table, model\.max_seq_len \(32\)",
  set={"model.seq_len": "33"})
P("n_layer_100000", r"model\.n_layer", set={"model.n_layer": "100000"}, timeout=15)
P("n_embd_10000_digits", r"option 'model\.n_embd' is invalid", set={"model.n_embd": "9" * 10000},
  max_output=16 << 10, doc="a value too long to quote whole still names its key")
P("model_far_beyond_memory", r"(?i)memory", forbid=r"out of host memory allocating|" + CRASH,
  set={"model.n_layer": "48", "model.n_embd": "16384", "model.n_head": "64", "model.vocab_size": "50257",
       "model.max_seq_len": "2048"}, timeout=15,
  doc="about 155 G parameters: refused before anything is allocated")
P("vocab_size_int_max", r"model\.vocab_size", set={"model.vocab_size": "2147483647"})
P("n_embd_2_pow_30", r"model\.n_embd", set={"model.n_embd": "1073741824"})

# [train]
P("steps_float", r"train\.steps", set={"train.steps": "2.5"})
P("steps_int_overflow", r"train\.steps", set={"train.steps": "99999999999999999999"})
P("batch_size_with_unit", r"train\.batch_size", set={"train.batch_size": "4k"})
P("batch_size_int_max_minus_1", r"train\.batch_size", set={"train.batch_size": "2147483646"})
P("micro_batch_negative", r"train\.micro_batch_size = \-1: must lie in", set={"train.micro_batch_size": "-1"})
P("lr_negative", r"train\.lr = -0\.001: must lie in", set={"train.lr": "-1e-3"})
P("lr_nan", r"train\.lr", set={"train.lr": "nan"})
P("lr_inf", r"train\.lr", set={"train.lr": "inf"})
P("lr_min_ratio_above_one", r"train\.lr_min_ratio = 2: must lie in", set={"train.lr_min_ratio": "2"})
P("lr_min_ratio_nan", r"train\.lr_min_ratio", set={"train.lr_min_ratio": "nan"})
P("warmup_negative", r"train\.warmup_steps = \-1: must lie in", set={"train.warmup_steps": "-1"})
P("weight_decay_negative", r"train\.weight_decay = \-0\.1: must lie in", set={"train.weight_decay": "-0.1"})
P("weight_decay_nan", r"train\.weight_decay", set={"train.weight_decay": "nan"})
P("weight_decay_inf", r"train\.weight_decay", set={"train.weight_decay": "inf"})
P("beta1_one", r"train\.beta1 = 1: must lie in", set={"train.beta1": "1"})
P("beta1_nan", r"train\.beta1", set={"train.beta1": "nan"})
P("beta2_negative", r"train\.beta2 = \-0\.5: must lie in", set={"train.beta2": "-0.5"})
P("beta2_nan", r"train\.beta2", set={"train.beta2": "nan"})
P("eps_zero", r"train\.eps = 0: must lie in", set={"train.eps": "0"})
P("eps_nan", r"train\.eps", set={"train.eps": "nan"})
P("eps_inf", r"train\.eps", set={"train.eps": "inf"})
P("grad_clip_negative", r"train\.grad_clip = \-1: must lie in", set={"train.grad_clip": "-1"})
P("grad_clip_nan", r"train\.grad_clip", set={"train.grad_clip": "nan"})
P("grad_clip_inf", r"train\.grad_clip", set={"train.grad_clip": "inf"})
P("log_every_zero", r"train\.log_every = 0: must lie in", set={"train.log_every": "0"})
P("seed_text", r"train\.seed", set={"train.seed": "abc"})
P("seed_minus_one", r"train\.seed", set={"train.seed": "-1"})

# [data], [output], [runtime], [debug]
P("data_path_empty", r"data\.path is required", set={"data.path": ""})
P("output_dir_empty", r"output\.dir must not be empty", set={"output.dir": ""})
P("threads_negative", r"runtime\.threads = \-1: must lie in", set={"runtime.threads": "-1"})
P("threads_100000", r"runtime\.threads", set={"runtime.threads": "100000"})
P("fail_step_zero", r"debug\.fail_step = 0: must lie in", set={"debug.fail_step": "0"})
P("fail_rank_beyond_world", r"debug\.fail_rank", set={"debug.fail_rank": "2"})

# [parallel]
P("tp_zero", r"parallel\.tp = 0: must lie in", set={"parallel.tp": "0"})
P("dp_negative", r"parallel\.dp = \-1: must lie in", set={"parallel.dp": "-1"})
P("ranks_per_node_negative", r"parallel\.ranks_per_node = \-1: must lie in", set={"parallel.ranks_per_node": "-1"})
P("micro_batches_negative", r"parallel\.micro_batches = \-1: must lie in", set={"parallel.micro_batches": "-1"})
P("stage_layers_empty_item", r"parallel\.stage_layers", set={"parallel.pp": "2", "parallel.dp": "1",
                                                               "parallel.stage_layers": "1,,1"})

# [finetune], [quant]
P("lora_rank_negative", r"finetune\.lora_rank = -4: must lie in", set={"finetune.mode": "lora", "finetune.lora_rank": "-4"})
P("lora_alpha_zero", r"finetune\.lora_alpha = 0: must lie in", set={"finetune.mode": "lora", "finetune.lora_alpha": "0"})
P("lora_alpha_nan", r"finetune\.lora_alpha", set={"finetune.mode": "lora", "finetune.lora_alpha": "nan"})
P("lora_alpha_inf", r"finetune\.lora_alpha", set={"finetune.mode": "lora", "finetune.lora_alpha": "inf"})
P("lora_targets_empty", r"finetune\.lora_targets", set={"finetune.mode": "lora", "finetune.lora_targets": ""})
P("quant_share_empty", r"quant\.share", set={"finetune.mode": "lora", "quant.share": ""})


# ---------------------------------------------------------------------------
# command_line: meshlm's arguments and --section.key overrides
# ---------------------------------------------------------------------------

def CL(name, regex, args, setup=None, **kw):
    add(name, "command_line", args, regex, setup=STD if setup is None else setup, **kw)


CL("override_without_value_at_end", r"--model\.n_layer needs a value", TRAIN + ["--model.n_layer"])
CL("override_value_is_next_override", r"--model\.n_layer needs a value",
   TRAIN + ["--model.n_layer", "--train.steps=1"])
CL("override_single_dash", r"unexpected argument '-model\.n_layer=2'", TRAIN + ["-model.n_layer=2"])
CL("stray_positional_argument", r"unexpected argument 'extra'", TRAIN + ["extra"])
CL("bare_double_dash", r"unexpected argument '--'", TRAIN + ["--"])
CL("override_empty_key", r"command line", TRAIN + ["--=3"])
# Program_options fills "%name%" tokens of its messages until none is left: a
# value holding one must not loop forever.
CL("override_value_is_a_message_token", r"parallel\.schedule.*use one of", TRAIN + ["--parallel.schedule=%value%"])
CL("override_number_is_a_message_token", r"train\.lr", TRAIN + ["--train.lr=%canonical_option%"])
CL("override_unknown_key", r"model\.n_layers", TRAIN + ["--model.n_layers=2"])
CL("override_without_section", r"n_layer", TRAIN + ["--n_layer=2"])
CL("override_empty_int", r"model\.n_layer", TRAIN + ["--model.n_layer="])
CL("override_double_equals", r"model\.n_layer", TRAIN + ["--model.n_layer=2=3"])
CL("override_last_value_is_bad", r"model\.n_layer", TRAIN + ["--model.n_layer=2", "--model.n_layer=x"])
CL("override_last_value_wins", r"# run log: out/run\.h5", TRAIN + ["--train.steps=x", "--train.steps=1"],
   **OUT_OK, doc="a key given twice takes its last value (docs/formats.md)")
CL("override_int_overflow", r"train\.batch_size", TRAIN + ["--train.batch_size=4294967296"])
# A value too long to quote whole is cut before the message is made: the key
# named after it in Program_options' sentence is still there.
CL("override_10000_digit_number", r"option '--train\.lr' is invalid", TRAIN + ["--train.lr=" + "9" * 10000],
   max_output=16 << 10)
CL("override_10000_digit_int", r"option '--train\.steps' is invalid", TRAIN + ["--train.steps=" + "9" * 10000],
   max_output=16 << 10)
CL("override_bad_bool", r"data\.shuffle", TRAIN + ["--data.shuffle=2"])
CL("override_empty_bool", r"command line: output\.overwrite has an empty value: give true or false",
   TRAIN + ["--output.overwrite="])
CL("override_lr_inf", r"train\.lr", TRAIN + ["--train.lr=inf"])
CL("override_bad_value_three_ranks", r"model\.n_layer", TRAIN + ["--model.n_layer=x"], ranks=3)
CL("layout_tp_on_three_ranks", r"parallel\.dp = 0 takes the ranks left by parallel\.tp \(2\).*3 ranks",
   TRAIN + ["--parallel.tp=2"], ranks=3)
CL("layout_dp_on_four_ranks", r"parallel\.dp \* parallel\.tp \* parallel\.pp = 3 \* 1 \* 1 = 3, but the job has 4 ranks",
   TRAIN + ["--parallel.dp=3", "--train.batch_size=6"], ranks=4)
CL("unknown_command", r"unknown command 'trian'", ["trian", "run.cfg"])
CL("no_command", r"no command given", [])
CL("train_without_parameter_file", r"needs a parameter file", ["train"])
CL("train_missing_parameter_file", r"cannot read parameter file 'missing\.cfg'", ["train", "missing.cfg"])
CL("parameter_file_is_directory", r"cfgdir", ["train", "cfgdir"], setup=STD + [mkdir("cfgdir")])
CL("parameter_file_symlink_loop", r"loop\.cfg", ["train", "loop.cfg"],
   setup=STD + [symlink("loop.cfg", "loop2.cfg"), symlink("loop2.cfg", "loop.cfg")])
CL("parameter_file_dangling_symlink", r"cannot read parameter file 'gone\.cfg'", ["train", "gone.cfg"],
   setup=STD + [symlink("gone.cfg", "nowhere.cfg")])
CL("parameter_file_fifo", r"fifo\.cfg", ["train", "fifo.cfg"], setup=STD + [fifo("fifo.cfg")],
   timeout=20)
CL("help_in_overrides_writes_nothing", r"--model\.n_layer", TRAIN + ["--help"], expect="ok",
   doc="--help prints every key and exits 0 without training or writing")
CL("quantize_without_arguments", r"usage: meshlm quantize", ["quantize"])
CL("tokenize_one_argument", r"usage: meshlm tokenize", ["tokenize", "in.txt"],
   setup=[blob("in.txt", "hello world\n")])
CL("tokenize_missing_input", r"missing\.txt", ["tokenize", "missing.txt", "out.h5"], setup=[])
CL("tokenize_empty_input", r"corpus \('empty\.txt'\) gives no tokens", ["tokenize", "empty.txt", "out.h5"],
   setup=[blob("empty.txt", b"")])
CL("tokenize_input_is_directory", r"input 'textdir' is a directory", ["tokenize", "textdir", "out.h5"],
   setup=[mkdir("textdir")])
CL("tokenize_output_is_directory", r"outdir", ["tokenize", "in.txt", "outdir"],
   setup=[blob("in.txt", "hello world\n"), mkdir("outdir")])
CL("tokenize_output_under_a_file", r"in\.txt/out\.h5", ["tokenize", "in.txt", "in.txt/out.h5"],
   setup=[blob("in.txt", "hello world\n")])
CL("tokenize_input_fifo", r"in\.fifo", ["tokenize", "in.fifo", "out.h5"], setup=[fifo("in.fifo")],
   timeout=20)
CL("tokenize_into_its_input", r"in\.txt", ["tokenize", "in.txt", "in.txt"],
   setup=[blob("in.txt", "hello world\n")])
CL("tokenize_into_its_input_via_symlink", r"in\.txt|link\.txt", ["tokenize", "in.txt", "link.txt"],
   setup=[blob("in.txt", "hello world\n"), symlink("link.txt", "in.txt")])


# ---------------------------------------------------------------------------
# tokens: data.path and data.tokenize_from
# ---------------------------------------------------------------------------

def T(name, regex, path, gen_step, extra_set=None, **kw):
    """A token-file case: data.path = `path`, made by gen_step (None: no file)."""
    s = {"data.path": path}
    s.update(extra_set or {})
    setup = ([gen_step] if gen_step else []) + [cfg(set=s)] + kw.pop("setup", [])
    add(name, "tokens", TRAIN + list(kw.pop("args", [])), regex, setup=setup, **kw)


ids = gen.gpl_ids()
T("empty_token_file", r"token file 'tokens\.bin': not an HDF5 token file nor a meshlm raw token file",
  "tokens.bin", blob("tokens.bin", b""))
T("raw_wrong_magic", r"token file 'tokens\.bin': not an HDF5 token file nor a meshlm raw",
  "tokens.bin", raw_tokens("tokens.bin", magic=b"MESHTOKX"))
T("raw_truncated_header", r"token file 'tokens\.bin': truncated header: file has 12 bytes",
  "tokens.bin", blob("tokens.bin", b"MESHTOK1\x01\x00\x00\x00"))
T("raw_format_version_2", r"token file 'tokens\.bin': raw format_version 2 is not supported",
  "tokens.bin", raw_tokens("tokens.bin", version=2))
T("raw_bytes_per_token_3", r"token file 'tokens\.bin': bytes_per_token is 3", "tokens.bin",
  raw_tokens("tokens.bin", bpt=3))
T("raw_n_tokens_max", r"token file 'tokens\.bin': header claims an impossible", "tokens.bin",
  raw_tokens("tokens.bin", n_tokens=(1 << 64) - 1))
T("raw_trailing_bytes", r"token file 'tokens\.bin': trailing bytes: file has 8025 bytes, expected 8024",
  "tokens.bin", raw_tokens("tokens.bin", trailing=b"x"))
T("raw_truncated_ids", r"token file 'tokens\.bin': truncated: file has 8022 bytes, expected 8024",
  "tokens.bin", raw_tokens("tokens.bin", n_tokens=4000, ids=ids[:3999]))
T("raw_zero_tokens", r"token file 'tokens\.bin' has 0 tokens; seq_len 32 needs at least 33",
  "tokens.bin", raw_tokens("tokens.bin", ids=ids[:0]))
T("raw_too_few_tokens", r"token file 'tokens\.bin' has 32 tokens; seq_len 32 needs at least 33",
  "tokens.bin", raw_tokens("tokens.bin", ids=ids[:32]))
T("raw_id_beyond_vocab_first", r"tokens\.bin.*position 0 has id 300", "tokens.bin",
  raw_tokens("tokens.bin", ids=[300] + list(ids[1:])), extra_set={"data.shuffle": "false"})
T("raw_id_beyond_vocab_last", r"tokens\.bin.*position 3999 has id 256", "tokens.bin",
  raw_tokens("tokens.bin", ids=list(ids[:-1]) + [256]))
T("raw_id_beyond_int32", r"tokens\.bin.*id 4294967295", "tokens.bin",
  raw_tokens("tokens.bin", bpt=4, ids=[0xFFFFFFFF] + list(ids[1:])), extra_set={"data.shuffle": "false"})
T("h5_without_tokens_dataset", r"token file 'ids\.h5': no dataset 'tokens'", "ids.h5",
  h5_tokens("ids.h5", dset="ids"))
T("h5_tokens_is_a_group", r"ids\.h5", "ids.h5", h5_tokens("ids.h5", group_instead=True))
T("h5_tokens_float32", r"token file 'ids\.h5': dataset 'tokens' is .*token ids must be a 2- or 4-byte integer",
  "ids.h5", h5_tokens("ids.h5", dtype="float32"))
T("h5_tokens_int64", r"token file 'ids\.h5': dataset 'tokens' is .*2- or 4-byte integer", "ids.h5",
  h5_tokens("ids.h5", dtype="int64"))
T("h5_tokens_2d", r"token file 'ids\.h5': dataset 'tokens' has shape \(40, 100\); it must be 1-D",
  "ids.h5", h5_tokens("ids.h5", shape=(40, 100)))
T("h5_tokens_scalar", r"ids\.h5", "ids.h5", h5_tokens("ids.h5", data=7))
T("h5_vocab_attr_larger", r"token file 'ids\.h5' declares vocab_size 50257 \(attribute\), larger than model\.vocab_size = 256",
  "ids.h5", h5_tokens("ids.h5", attrs={"vocab_size": 50257}))
T("h5_vocab_attr_on_dataset_larger", r"declares vocab_size 512.*model\.vocab_size = 256", "ids.h5",
  h5_tokens("ids.h5", dset_attrs={"vocab_size": 512}))
T("h5_vocab_attr_is_text", r"ids\.h5", "ids.h5", h5_tokens("ids.h5", attrs={"vocab_size": "256"}))
T("h5_vocab_attr_negative", r"token file 'ids\.h5': attribute vocab_size = -5 is not a vocabulary size",
  "ids.h5", h5_tokens("ids.h5", attrs={"vocab_size": -5}))
T("h5_max_id_attr_negative", r"token file 'ids\.h5': attribute max_id = -2 is not a token id",
  "ids.h5", h5_tokens("ids.h5", attrs={"vocab_size": 256, "max_id": -2}))
T("h5_format_version_2", r"ids\.h5.*format_version", "ids.h5",
  h5_tokens("ids.h5", attrs={"vocab_size": 256, "format_version": 2}))
T("h5_negative_ids", r"ids\.h5.*position 0 has id -5", "ids.h5",
  h5_tokens("ids.h5", data=[-5] + list(ids[1:]), dtype="int16"), extra_set={"data.shuffle": "false"})
T("h5_ids_beyond_model_vocab_no_attr", r"ids\.h5.*>= vocab_size 100", "ids.h5",
  h5_tokens("ids.h5"), extra_set={"model.vocab_size": "100"})
T("h5_truncated", r"tokens\.h5", "tokens.h5", tokens(), setup=[truncate("tokens.h5", 40000)])
T("h5_signature_damaged", r"token file 'tokens\.h5': not an HDF5", "tokens.h5", tokens(),
  setup=[gen.patch_bytes("tokens.h5", 0, b"\x00")])
T("token_vocab_larger_than_model", r"declares vocab_size 256 \(attribute\), larger than model\.vocab_size = 100",
  "tokens.h5", tokens(), extra_set={"model.vocab_size": "100"})
T("data_path_missing_file", r"data\.path: token file 'missing\.h5' does not exist", "missing.h5", None)
T("data_path_directory", r"data\.path.*tokdir", "tokdir", mkdir("tokdir"),
  forbid=r"data\.path is required|" + CRASH)
T("data_path_directory_trailing_slash", r"data\.path.*tokdir/", "tokdir/", mkdir("tokdir"),
  forbid=r"data\.path is required|" + CRASH)
T("data_path_fifo", r"data\.path.*tokens\.fifo", "tokens.fifo", fifo("tokens.fifo"), timeout=10)
T("data_path_10000_chars", r"data\.path", "./" * 4995 + "tokens.h5", tokens(),
  forbid=r"data\.tokenize_from|" + CRASH, extra_set={"data.tokenize_from": "corpus.txt"},
  setup=[blob("corpus.txt", "some text " * 100)])
T("data_path_symlink_loop", r"data\.path.*loop\.h5", "loop.h5", symlink("loop.h5", "loop2.h5"),
  forbid=r"data\.tokenize_from|" + CRASH, extra_set={"data.tokenize_from": "corpus.txt"},
  setup=[symlink("loop2.h5", "loop.h5"), blob("corpus.txt", "some text " * 100)])
T("data_path_under_a_file", r"data\.(path|tokenize_from).*corpus\.txt/tokens\.h5", "corpus.txt/tokens.h5",
  blob("corpus.txt", "some text " * 100), extra_set={"data.tokenize_from": "corpus.txt"})
T("data_path_trailing_slash_tokenize_from", r"data\.path.*new\.h5/", "new.h5/", None,
  extra_set={"data.tokenize_from": "corpus.txt"}, setup=[blob("corpus.txt", "some text " * 100)],
  doc="data.path names a directory that does not exist: nothing may be created")
T("tokenize_from_missing", r"data\.tokenize_from.*missing\.txt", "new.h5", None,
  extra_set={"data.tokenize_from": "missing.txt"})
T("tokenize_from_directory", r"data\.tokenize_from.*text file 'textdir' is a directory", "new.h5",
  mkdir("textdir"), extra_set={"data.tokenize_from": "textdir"})
T("tokenize_from_empty_file", r"data\.tokenize_from.*text file 'empty\.txt' is empty", "new.h5",
  blob("empty.txt", b""), extra_set={"data.tokenize_from": "empty.txt"})
T("tokenize_from_too_short", r"new\.h5' has 10 tokens; seq_len 32 needs at least 33", "new.h5",
  blob("short.txt", b"0123456789"), extra_set={"data.tokenize_from": "short.txt"},
  may_change=("new.h5",), doc="the tokens are written (data.tokenize_from's job), then refused")
T("bad_token_file_four_ranks", r"token file 'tokens\.bin': bytes_per_token is 3", "tokens.bin",
  raw_tokens("tokens.bin", bpt=3), ranks=4)
T("token_file_named_txt_is_read", r"# run log: out/run\.h5", "tokens.txt", tokens("tokens.txt"), **OUT_OK,
  doc="the format is told by the first bytes, not the extension")
T("raw_token_file_named_h5_is_read", r"# run log: out/run\.h5", "raw.h5", raw_tokens("raw.h5"), **OUT_OK)


# Held-out tokens (train.eval_every): data.val_path, or data.path's /val_tokens.
def V(name, regex, setup, extra_set=None, **kw):
    """A validation case: tokens.h5 as data.path, evaluation every step."""
    s = {"train.eval_every": "1"}
    s.update(extra_set or {})
    add(name, "tokens", TRAIN + list(kw.pop("args", [])), regex,
        setup=[tokens()] + setup + [cfg(set=s)], **kw)


V("val_eval_every_without_held_out",
  r"train\.eval_every = 1 needs held-out tokens: data\.val_path is empty and data\.path 'tokens\.h5' "
  r"has no dataset 'val_tokens'", [])
V("val_path_missing_file", r"data\.val_path: token file 'missing\.h5' does not exist", [],
  {"data.val_path": "missing.h5"})
V("val_path_is_data_path", r"data\.val_path and data\.path are the same file, 'tokens\.h5', which has "
  r"no dataset 'val_tokens'", [], {"data.val_path": "tokens.h5"})
V("val_path_is_data_path_via_symlink", r"data\.val_path and data\.path are the same file, 'link\.h5'",
  [symlink("link.h5", "tokens.h5")], {"data.val_path": "link.h5"})
V("val_path_ids_beyond_vocab", r"data\.val_path: token file 'val\.h5': position 0 has id 300, >= vocab_size "
  r"256 \(model\.vocab_size\)", [h5_tokens("val.h5", data=[300] + list(ids[1:]))],
  {"data.val_path": "val.h5"})
V("val_path_raw_ids_beyond_vocab", r"data\.val_path: token file 'val\.bin': position 3999 has id 256",
  [raw_tokens("val.bin", ids=list(ids[:-1]) + [256])], {"data.val_path": "val.bin"})
V("val_path_too_short", r"data\.val_path: token file 'val\.bin' has 32 tokens; model\.seq_len 32 needs "
  r"at least 33", [raw_tokens("val.bin", ids=ids[:32])], {"data.val_path": "val.bin"})
V("val_path_vocab_attr_larger", r"data\.val_path: token file 'val\.h5' declares vocab_size 50257",
  [h5_tokens("val.h5", attrs={"vocab_size": 50257})], {"data.val_path": "val.h5"})
V("val_path_not_a_token_file", r"data\.val_path: token file 'val\.txt': not an HDF5 token file",
  [blob("val.txt", "held-out text\n")], {"data.val_path": "val.txt"})
V("val_path_without_tokens_dataset", r"data\.val_path: token file 'val\.h5': no dataset 'tokens'",
  [h5_tokens("val.h5", dset="ids")], {"data.val_path": "val.h5"})
V("val_path_directory", r"data\.val_path: 'valdir' is a directory", [mkdir("valdir")],
  {"data.val_path": "valdir"})
V("val_path_fifo", r"data\.val_path.*val\.fifo", [fifo("val.fifo")], {"data.val_path": "val.fifo"},
  timeout=10)
V("val_path_is_quant_cache", r"quant\.cache and data\.val_path are the same file",
  [tokens("val.h5")], {"data.val_path": "val.h5", "quant.cache": "val.h5"})
V("val_tokens_ids_beyond_vocab",
  r"data\.path: token file 'both\.h5' \(dataset 'val_tokens'\): position 5 has id 999",
  [gen.h5_tokens_with_val("both.h5", [1, 2, 3, 4, 5, 999] + list(ids[6:100]))], {"data.path": "both.h5"})
V("val_tokens_too_short",
  r"data\.path: token file 'both\.h5' \(dataset 'val_tokens'\) has 20 tokens; model\.seq_len 32",
  [gen.h5_tokens_with_val("both.h5", ids[:20])], {"data.path": "both.h5"})
V("val_tokens_float", r"data\.path: token file 'both\.h5': dataset 'val_tokens' is .*2- or 4-byte integer",
  [gen.h5_tokens_with_val("both.h5", ids[:100], val_dtype="float32")], {"data.path": "both.h5"})
P("eval_every_negative", r"train\.eval_every = -1: must lie in", set={"train.eval_every": "-1"})
P("eval_batches_zero", r"train\.eval_batches = 0: must lie in", set={"train.eval_batches": "0"})
V("val_tokens_of_data_path_are_read", r"step 2 val_loss \d+\.\d+ \(1 batches, 128 tokens",
  [gen.h5_tokens_with_val("both.h5", ids[:1000])],
  {"data.path": "both.h5", "train.eval_batches": "1"}, **OUT_OK)
V("val_path_with_val_tokens_is_read", r"step 1 val_loss .*\n(.*\n)*.*step 2 val_loss",
  [gen.h5_tokens_with_val("both.h5", ids[:1000])], {"data.path": "both.h5", "data.val_path": "both.h5"},
  **OUT_OK, doc="data.val_path = data.path is fine when the file has /val_tokens: those are read")


# ---------------------------------------------------------------------------
# safetensors (and meshlm HDF5): quant.base
# ---------------------------------------------------------------------------

LORA = {"finetune.mode": "lora"}


def S(name, regex, gen_step, base="base.safetensors", mode=LORA, **kw):
    s = dict(mode)
    s["quant.base"] = base
    s.update(kw.pop("extra_set", {}))
    setup = [tokens(), cfg(set=s)] + ([gen_step] if gen_step else []) + kw.pop("setup", [])
    add(name, "safetensors", TRAIN + list(kw.pop("args", [])), regex, setup=setup, **kw)


ST = r"safetensors file 'base\.safetensors': "


def _dup_header():
    t = gen.gpt2_tensors()
    body = gen.safetensors_bytes(t)
    n = int.from_bytes(body[:8], "little")
    header = body[8:8 + n].decode()
    data = body[8 + n:]
    # A second "ln_f.bias" entry pointing at wte's first bytes.
    extra = ', "ln_f.bias": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}}'
    header = header[:-1] + extra
    return len(header).to_bytes(8, "little") + header.encode() + data


def drop(name):
    return lambda t: t.pop(name)


def poke(name, value, index=5):
    def edit(t):
        t[name] = t[name].copy()
        t[name].flat[index] = value
    return edit


def patch(name, key, value):
    def p(h):
        h[name][key] = value
    return p


S("st_empty_file", ST + r"file has 0 bytes", blob("base.safetensors", b""))
S("st_truncated_length", ST + r"file has 4 bytes", blob("base.safetensors", b"\x10\x00\x00\x00"))
S("st_header_length_beyond_file", ST + r"truncated header: the header length says 1000000 bytes",
  safetensors(header_len=1000000, data_trailing=b""), doc="length field past the end of the file")
S("st_header_length_absurd", ST + r"header length 1099511627776 bytes is absurd",
  safetensors(header_len=1 << 40))
S("st_header_not_json", ST + r"header is not valid JSON", safetensors(raw_header=b"{not json at all"))
S("st_header_json_array", ST + r"header is not a JSON object", safetensors(raw_header=b"[1, 2, 3]"))
S("st_header_trailing_garbage", ST + r"header is not valid JSON",
  safetensors(header_pad=b"}garbage"))
S("st_missing_dtype", ST + r"tensor 'ln_f\.bias' has no \"dtype\"",
  safetensors(header_patch=lambda h: h["ln_f.bias"].pop("dtype")))
S("st_unknown_dtype", ST + r"tensor 'ln_f\.bias' has dtype 'F99'",
  safetensors(header_patch=patch("ln_f.bias", "dtype", "F99")))
S("st_integer_dtype", ST + r"tensor 'h\.0\.ln_1\.bias' has dtype 'I32' which meshlm cannot read as float",
  safetensors(edit=lambda t: t.update({"h.0.ln_1.bias": t["h.0.ln_1.bias"].astype("int32")})))
S("st_offsets_past_end", ST + r"tensor 'ln_f\.bias': data_offsets .* run past the end of the file",
  safetensors(header_patch=lambda h: h["ln_f.bias"].update(
      data_offsets=[h["ln_f.bias"]["data_offsets"][0], h["ln_f.bias"]["data_offsets"][1] + 4096])))
S("st_offsets_end_before_begin", ST + r"tensor 'ln_f\.bias': data_offsets .* end before they begin",
  safetensors(header_patch=lambda h: h["ln_f.bias"].update(
      data_offsets=list(reversed(h["ln_f.bias"]["data_offsets"])))))
S("st_offsets_size_mismatch", ST + r"tensor 'ln_f\.bias': data_offsets .* hold 256 bytes but shape",
  safetensors(header_patch=lambda h: h["ln_f.bias"].update(
      data_offsets=[h["ln_f.weight"]["data_offsets"][0], h["ln_f.bias"]["data_offsets"][1]])))
S("st_offsets_overlap", ST + r"tensors '(ln_f\.bias|ln_f\.weight)'.*overlap",
  safetensors(header_patch=lambda h: h["ln_f.bias"].update(data_offsets=h["ln_f.weight"]["data_offsets"])),
  doc="two tensors claim the same bytes")
S("st_offsets_negative", ST + r"tensor 'ln_f\.bias': \"data_offsets\" must be",
  safetensors(header_patch=patch("ln_f.bias", "data_offsets", [-128, 0])))
S("st_shape_negative", ST + r"tensor 'ln_f\.bias': \"shape\" must be",
  safetensors(header_patch=patch("ln_f.bias", "shape", [-32])))
S("st_shape_overflow", ST + r"tensor 'ln_f\.bias': shape .* larger than 2\^64 bytes",
  safetensors(header_patch=patch("ln_f.bias", "shape", [1 << 40, 1 << 40])))
S("st_wrong_shape", ST + r"tensor 'ln_f\.weight' has shape \[31\]; meshlm expects \[32\]",
  safetensors(edit=lambda t: t.update({"ln_f.weight": t["ln_f.weight"][:31]})))
S("st_conv1d_not_transposed", ST + r"tensor 'h\.0\.attn\.c_attn\.weight' has shape \[96, 32\]; meshlm expects \[32, 96\]",
  safetensors(edit=lambda t: t.update({"h.0.attn.c_attn.weight": t["h.0.attn.c_attn.weight"].T.copy()})))
S("st_missing_tensor", ST + r"no tensor 'ln_f\.bias' \(nor 'transformer\.ln_f\.bias'\)",
  safetensors(edit=drop("ln_f.bias")))
S("st_both_names", ST + r"holds both 'wte\.weight' and 'transformer\.wte\.weight'",
  safetensors(edit=lambda t: t.update({"transformer.wte.weight": t["wte.weight"]})))
S("st_wpe_too_few_rows", ST + r"tensor 'wpe\.weight' has shape \[16, 32\]",
  safetensors(edit=lambda t: t.update({"wpe.weight": t["wpe.weight"][:16]})))
S("st_metadata_not_object", ST + r"\"__metadata__\" is not a JSON object", safetensors(metadata=5))
S("st_duplicate_tensor_name", ST + r"header names 'ln_f\.bias' twice", lambda w, fx: gen.write(w, "base.safetensors", _dup_header()),
  doc="the JSON header names ln_f.bias twice (with different offsets)")
S("st_text_file", ST, blob("base.safetensors", "not a safetensors file\n" * 10))
S("st_base_is_directory", r"base\.safetensors", mkdir("base.safetensors"))
S("st_base_fifo", r"base\.safetensors", fifo("base.safetensors"), timeout=10)
S("st_base_missing", r"safetensors file 'missing\.safetensors'", None, base="missing.safetensors")
S("st_unknown_extension", r"base weights 'base\.bin': unknown kind of file", fixture("base.safetensors", "base.bin"),
  base="base.bin")
S("base_nan_lora_nf4", r"h\.1\.mlp\.c_fc\.weight", safetensors(edit=poke("h.1.mlp.c_fc.weight", float("nan"))))
S("base_nan_lora_int8", r"h\.1\.mlp\.c_fc\.weight", safetensors(edit=poke("h.1.mlp.c_fc.weight", float("nan"))),
  extra_set={"quant.type": "int8"})
S("base_nan_full", r"h\.1\.mlp\.c_fc\.weight", safetensors(edit=poke("h.1.mlp.c_fc.weight", float("nan"))),
  mode={"finetune.mode": "full"})
S("base_inf_lora_nf4", r"h\.0\.attn\.c_proj\.weight", safetensors(edit=poke("h.0.attn.c_proj.weight", float("inf"))))
S("full_mode_missing_tensor", ST + r"no tensor 'h\.1\.ln_2\.weight'", safetensors(edit=drop("h.1.ln_2.weight")),
  mode={"finetune.mode": "full"})
S("st_transformer_prefix_is_read", r"# run log: out/run\.h5", safetensors(prefix="transformer."), **OUT_OK,
  doc="names prefixed transformer. are Hugging Face's too")
S("base_h5_missing_dataset", r"meshlm HDF5 file 'base\.h5': no dataset '/params/ln_f\.bias'",
  params_h5(edit=drop("ln_f.bias")), base="base.h5")
S("base_h5_wrong_shape", r"meshlm HDF5 file 'base\.h5': dataset '/params/h\.0\.mlp\.c_fc\.weight' has shape \[32, 128\]",
  params_h5(edit=lambda t: t.update({"h.0.mlp.c_fc.weight": t["h.0.mlp.c_fc.weight"].T.copy()})), base="base.h5")
S("base_h5_format_version_2", r"meshlm HDF5 file 'base\.h5': format_version 2 is not supported",
  params_h5(attrs={"format_version": 2}), base="base.h5")
S("base_h5_other_vocab", r"meshlm HDF5 file 'base\.h5': written for vocab_size 250, the model has 256",
  params_h5(attrs={"vocab_size": 250}), base="base.h5")
S("base_h5_int_dataset", r"base\.h5.*ln_f\.weight", params_h5(
    edit=lambda t: t.update({"ln_f.weight": t["ln_f.weight"].astype("int64")}), dtype=None), base="base.h5")
S("base_h5_not_hdf5", r"base\.h5.*not an HDF5 file", blob("base.h5", "text\n"), base="base.h5")
S("base_h5_nan_lora", r"ln_f\.weight", params_h5(edit=poke("ln_f.weight", float("nan"), 3)), base="base.h5")


# ---------------------------------------------------------------------------
# cache: quant.cache (meshlm quantize, and train under LoRA)
# ---------------------------------------------------------------------------

QUANT = ["quantize", "run.cfg"]


def Q(name, regex, cache_step, cache="cache.h5", args=QUANT, extra_set=None, **kw):
    s = {"finetune.mode": "lora", "quant.cache": cache}
    s.update(extra_set or {})
    setup = [tokens(), cfg(set=s)] + ([cache_step] if cache_step else []) + kw.pop("setup", [])
    add(name, "cache", list(args), regex, setup=setup, **kw)


def cache_is_good(name="cache.h5"):
    """post: the cache at `name` is the fixture's (same key, same tensors)."""
    def post(work, runner):
        import h5py
        with h5py.File(runner.fixtures / "cache-nf4.h5", "r") as ref, h5py.File(work / name, "r") as f:
            if f["meta"].attrs["key"] != ref["meta"].attrs["key"]:
                return "%s was rewritten with another key" % name
            if sorted(f["q"]) != sorted(ref["q"]):
                return "%s holds other tensors" % name
            for t in ref["q"]:
                if f["q"][t].attrs["xxh3_64"] != ref["q"][t].attrs["xxh3_64"]:
                    return "%s: tensor %s differs from a fresh quantization" % (name, t)
        return None
    return post


def drop_group(path):
    def edit(f):
        del f[path]
    return edit


REWRITE = dict(expect="ok", may_change=("cache.h5",), post=cache_is_good())
Q("cache_hit_changes_nothing", r"cache is up to date", fixture("cache-nf4.h5", "cache.h5"), expect="ok",
  doc="a valid cache is read, never rewritten")
Q("cache_truncated_is_replaced", r"WARNING: quant\.cache.*cache\.h5", fixture("cache-nf4.h5", "cache.h5"),
  setup=[truncate("cache.h5", -20000)], **REWRITE)
Q("cache_flipped_byte_is_replaced", r"WARNING: quant\.cache.*cache\.h5", fixture("cache-nf4.h5", "cache.h5"),
  setup=[flip_byte("cache.h5", 3000)], **REWRITE)
Q("cache_missing_tensor_is_replaced", r"WARNING: quant\.cache.*cache\.h5",
  cache_edit("cache.h5", drop_group("q/h.1.mlp.c_fc.weight")), **REWRITE)
Q("cache_wrong_format_version_is_rewritten", r"quant\.cache.*cache\.h5",
  cache_edit("cache.h5", lambda f: set_attr(f["meta"], "format_version", 2)), **REWRITE)
Q("cache_wrong_key_is_rewritten", r"quant\.cache.*cache\.h5",
  cache_edit("cache.h5", lambda f: set_attr(f["meta"], "key", "0" * 32)), **REWRITE)
Q("cache_wrong_checksum_attr_is_replaced", r"WARNING: quant\.cache.*cache\.h5",
  cache_edit("cache.h5", lambda f: f["q"]["ln_f.weight"].attrs.modify(
      "xxh3_64", f["q"]["ln_f.weight"].attrs["xxh3_64"] ^ __import__("numpy").uint64(1))), **REWRITE)
Q("cache_truncated_train_lora", r"WARNING: quant\.cache.*cache\.h5", fixture("cache-nf4.h5", "cache.h5"),
  args=TRAIN, setup=[truncate("cache.h5", -20000)], expect="ok", may_change=("cache.h5", "out"),
  must_exist=("out/run.h5",), post=cache_is_good(), timeout=60)
Q("cache_in_new_directory_is_written", r"written to caches/a/cache\.h5", None, cache="caches/a/cache.h5",
  expect="ok", may_change=("caches",), post=cache_is_good("caches/a/cache.h5"))
Q("cache_is_directory", r"cache\.h5", mkdir("cache.h5"))
Q("cache_under_a_file", r"notes\.txt/cache\.h5", blob("notes.txt", "notes\n"), cache="notes.txt/cache.h5")
Q("cache_in_proc", r"quant: .*/proc/meshlm-badinput/cache\.h5", None, cache="/proc/meshlm-badinput/cache.h5")
Q("cache_kept_when_base_missing", r"missing\.safetensors", fixture("cache-nf4.h5", "cache.h5"),
  extra_set={"quant.base": "missing.safetensors"}, doc="a failed quantize leaves the old cache as it was")
Q("cache_kept_when_base_corrupt", r"base\.safetensors", fixture("cache-nf4.h5", "cache.h5"),
  extra_set={"quant.base": "base.safetensors"},
  setup=[safetensors(header_patch=patch("ln_f.bias", "dtype", "F99"))])
Q("cache_is_fifo", r"quant\.cache.*cache\.fifo", fifo("cache.fifo"), cache="cache.fifo", timeout=10)
Q("cache_is_text_file", r"quant\.cache.*notes\.txt", blob("notes.txt", "my notes\n" * 100), cache="notes.txt")
Q("cache_is_token_file", r"quant\.cache.*tokens\.h5", None, cache="tokens.h5")
Q("cache_is_parameter_file", r"quant\.cache.*run\.cfg", None, cache="run.cfg")
Q("cache_is_base_safetensors", r"quant\.cache.*base\.safetensors", fixture("base.safetensors"),
  cache="base.safetensors", extra_set={"quant.base": "base.safetensors"})
Q("cache_is_hdf5_without_meta", r"quant\.cache.*other\.h5", h5_tokens("other.h5", dset="results"),
  cache="other.h5")
Q("cache_symlink_to_token_file", r"quant\.cache.*(link\.h5|tokens\.h5)", symlink("link.h5", "tokens.h5"),
  cache="link.h5")
Q("cache_is_token_file_train", r"quant\.cache.*tokens\.h5", None, cache="tokens.h5", args=TRAIN)


# ---------------------------------------------------------------------------
# output_dir: output.dir and the run log
# ---------------------------------------------------------------------------

def O(name, regex, outdir, setup_steps=(), **kw):
    setup = [tokens(), cfg(set={"output.dir": outdir})] + list(setup_steps)
    add(name, "output_dir", TRAIN + list(kw.pop("args", [])), regex, setup=setup, **kw)


FIRST_RUN = [(1, TRAIN)]
O("output_dir_is_a_file", r"output\.dir.*notes\.txt", "notes.txt", [blob("notes.txt", "notes\n")])
O("output_dir_under_a_file", r"output\.dir.*notes\.txt/run", "notes.txt/run", [blob("notes.txt", "notes\n")])
O("output_dir_in_proc", r"output\.dir.*/proc/meshlm-badinput", "/proc/meshlm-badinput/out")
O("output_dir_dangling_symlink", r"output\.dir.*out", "out", [symlink("out", "nowhere")])
O("output_dir_symlink_loop", r"output\.dir.*out", "out", [symlink("out", "out2"), symlink("out2", "out")])
O("output_dir_is_fifo", r"output\.dir.*out", "out", [fifo("out")])
O("output_dir_10000_chars", r"output\.dir", "./" * 4998 + "out")
O("output_dir_component_too_long", r"output\.dir", "x" * 300)
O("run_h5_is_a_directory", r"out/run\.h5", "out", [mkdir("out/run.h5")])
O("output_dir_is_a_file_four_ranks", r"output\.dir.*notes\.txt", "notes.txt", [blob("notes.txt", "notes\n")],
  ranks=4)
O("output_dir_file_with_new_cache", r"output\.dir.*notes\.txt", "notes.txt", [blob("notes.txt", "notes\n")],
  args=["--finetune.mode=lora", "--quant.cache=cache.h5"],
  doc="a run that cannot write its output writes no quantization cache either")
O("output_dir_file_with_tokenize_from", r"output\.dir.*notes\.txt", "notes.txt", [blob("notes.txt", "notes\n"),
  blob("corpus.txt", "some text " * 400)], args=["--data.path=new.h5", "--data.tokenize_from=corpus.txt"],
  doc="a run that cannot write its output tokenizes nothing")
O("bad_value_keeps_previous_run", r"train\.lr = -1: must lie in", "out", args=["--train.lr=-1"], before=FIRST_RUN,
  doc="an error in the parameters leaves the previous run's out/run.h5 as it was")
O("bad_tokens_keep_previous_run", r"tokens\.bin|output\.dir 'out' holds the run log", "out",
  [raw_tokens("tokens.bin", bpt=3)], args=["--data.path=tokens.bin"], before=FIRST_RUN)
O("nested_new_output_dir_is_created", r"# run log: a/b/c/run\.h5", "a/b/c", expect="ok", may_change=("a",),
  must_exist=("a/b/c/run.h5",))
O("second_run_same_output_dir", r"output\.dir.*out|out/run\.h5", "out", before=FIRST_RUN,
  doc="run.h5 of the first run must not be replaced silently")
O("second_run_overwrite_true", r"# run log: out/run\.h5", "out", args=["--output.overwrite=true"],
  before=FIRST_RUN, expect="ok", may_change=("out",))
O("run_h5_symlink_to_token_file", r"out/run\.h5", "out", [mkdir("out"), symlink("out/run.h5", "../tokens.h5")],
  doc="the token file behind out/run.h5 must not be overwritten")
O("run_h5_symlink_to_other_file", r"out/run\.h5", "out", [blob("notes.txt", "notes\n"), mkdir("out"),
  symlink("out/run.h5", "../notes.txt")], doc="the file behind out/run.h5 must not be overwritten")
O("two_runs_at_once_same_output_dir", r"output\.dir.*out", "out", concurrent=2, expect="one_ok",
  may_change=("out",), timeout=60)


# checkpoint.dir: a directory that could never hold a checkpoint is refused
# before step 1 (any step may write one: checkpoint.every, a stop signal, the
# end), with nothing written, where it was found only at the first save.
def K(name, regex, ckdir, setup_steps=(), **kw):
    setup = [tokens(), cfg(set={"output.dir": "out", "checkpoint.dir": ckdir})] + list(setup_steps)
    add(name, "output_dir", TRAIN + list(kw.pop("args", [])), regex, setup=setup, **kw)


K("checkpoint_dir_is_a_file", r"checkpoint\.dir: 'notes\.txt' is a regular file", "notes.txt",
  [blob("notes.txt", "notes\n")])
K("checkpoint_dir_under_a_file", r"checkpoint\.dir: 'notes\.txt/ckpt' is below '.*notes\.txt', which is a "
  r"regular file", "notes.txt/ckpt", [blob("notes.txt", "notes\n")])
K("checkpoint_dir_under_a_file_four_ranks", r"checkpoint\.dir: 'notes\.txt/ckpt' is below", "notes.txt/ckpt",
  [blob("notes.txt", "notes\n")], ranks=4)
K("checkpoint_dir_in_proc", r"checkpoint\.dir: '/proc/meshlm-badinput/ckpt' cannot be written: making a "
  r"directory in '/proc' failed", "/proc/meshlm-badinput/ckpt")
K("checkpoint_dir_dangling_symlink", r"checkpoint\.dir: 'ckpt' is a broken symbolic link", "ckpt",
  [symlink("ckpt", "nowhere")])
# `latest` is replaced at every save: one that is not meshlm's (another
# content, a directory) is refused before step 1, set checkpoint.dir or not.
K("checkpoint_latest_foreign", r"checkpoint\.dir: 'ckpt/latest' is not meshlm's \(it holds 'my notes'",
  "ckpt", [blob("ckpt/latest", "my notes\n")])
K("checkpoint_latest_is_a_directory", r"checkpoint\.dir: 'ckpt/latest' is a directory", "ckpt",
  [mkdir("ckpt/latest")])
O("default_checkpoint_dir_is_a_file", r"checkpoint\.dir \(output\.dir/checkpoints\): 'out/checkpoints' is a "
  r"regular file", "out", [blob("out/checkpoints", "notes\n")])
O("default_checkpoint_latest_foreign", r"checkpoint\.dir \(output\.dir/checkpoints\): 'out/checkpoints/latest' "
  r"is not meshlm's", "out", [blob("out/checkpoints/latest", "my notes\n")])
O("default_checkpoint_latest_is_a_directory", r"'out/checkpoints/latest' is a directory", "out",
  [mkdir("out/checkpoints/latest")])
# A fresh run (checkpoint.resume = none) pointed at another run's checkpoints
# would write its step files over them and move their `latest` back.
CKPT_RUN = [(1, TRAIN + ["--checkpoint.final=true"])]
O("fresh_run_into_other_checkpoints", r"checkpoint\.dir: 'out/checkpoints' holds the checkpoints of an earlier "
  r"run \(latest, step_00000002\.h5\)", "out", args=["--output.dir=out2", "--checkpoint.dir=out/checkpoints"],
  before=CKPT_RUN, doc="the first run's checkpoints and latest are left as they were")
O("fresh_run_into_other_checkpoints_overwrite", r"# checkpoint: writing step 2 to out/checkpoints/step_00000002\.h5",
  "out", args=["--output.dir=out2", "--checkpoint.dir=out/checkpoints", "--checkpoint.final=true",
               "--output.overwrite=true"], before=CKPT_RUN, expect="ok", may_change=("out", "out2"),
  doc="output.overwrite = true: the new run's checkpoints replace the earlier run's")
