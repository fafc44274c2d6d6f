// The parameter file parser, in process (tests/cli.cmake runs the same
// errors through mpiexec and checks exit status and output).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "app/parameter_file.h"
#include "core/error.h"
#include "train/backend.h"
#include "train/engine.h"

using namespace meshlm;

namespace {
const char* kGood =
    "[model]\nn_layer = 3\nn_head = 2\nn_embd = 16\nvocab_size = 100\nseq_len = 8\nmax_seq_len = 8\n"
    "[train]\nsteps = 5\nbatch_size = 4\nmicro_batch_size = 2\nlr = 0.01\n"
    "[data]\npath = tokens.h5\n";

// The message of the CollectiveError thrown by parsing, or "" if none.
std::string error_of(const std::string& text, std::vector<std::string> overrides = {},
                     int world_size = 1) {
  try {
    parse_run_config(text, "test.cfg", overrides, world_size);
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, ParsesFileAndDefaults) {
  RunConfig c = parse_run_config(kGood, "test.cfg", {});
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.vocab_size, 100);
  EXPECT_EQ(c.train.seq_len, 8);
  EXPECT_EQ(c.parallel.micro_batches, 2);  // batch_size / micro_batch_size
  EXPECT_DOUBLE_EQ(c.train.lr, 0.01);
  EXPECT_DOUBLE_EQ(c.train.adamw.weight_decay, 0.1);  // default
  EXPECT_EQ(c.data.path, "tokens.h5");
  EXPECT_NE(c.resolved.find("[train]\n"), std::string::npos);
  EXPECT_NE(c.resolved.find("n_layer = 3\n"), std::string::npos);
  EXPECT_NE(c.resolved.find("weight_decay = 0.1\n"), std::string::npos);
}

TEST(Config, CommandLineOverridesFile) {
  RunConfig c = parse_run_config(kGood, "test.cfg", {"--model.n_layer=5", "--train.lr", "0.5"});
  EXPECT_EQ(c.model.n_layer, 5);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.5);
  EXPECT_NE(c.resolved.find("n_layer = 5\n"), std::string::npos);
}

TEST(Config, LastOverrideOfAKeyWins) {
  RunConfig c = parse_run_config(kGood, "t", {"--output.dir=job", "--train.lr", "0.5",
                                              "--output.dir=mine", "--data.tokenize_from="});
  EXPECT_EQ(c.output.dir, "mine");
  EXPECT_DOUBLE_EQ(c.train.lr, 0.5);
  EXPECT_EQ(c.data.tokenize_from, "");
  EXPECT_NE(error_of(kGood, {"--train.lr"}).find("--train.lr needs a value"), std::string::npos);
}

// Editors on Windows (Notepad, some IDEs) start a UTF-8 file with a byte
// order mark, and write CRLF line ends: the same file to meshlm. A BOM
// elsewhere, and a file in UTF-16, are refused by line.
TEST(Config, AByteOrderMarkAndCrlfLineEndsAreTheSameFile) {
  std::string crlf;
  for (const char ch : std::string(kGood)) crlf += ch == '\n' ? std::string("\r\n") : std::string(1, ch);
  for (const std::string& text : {"\xEF\xBB\xBF" + std::string(kGood), crlf, "\xEF\xBB\xBF" + crlf}) {
    const RunConfig c = parse_run_config(text, "test.cfg", {});
    EXPECT_EQ(c.model.n_layer, 3);
    EXPECT_EQ(c.data.path, "tokens.h5");
    EXPECT_EQ(c.resolved, parse_run_config(kGood, "test.cfg", {}).resolved);
  }
  EXPECT_NE(error_of("[model]\n\xEF\xBB\xBFn_layer = 3\n").find("test.cfg: "), std::string::npos);
  const std::string utf16("\xFF\xFE[\0m\0", 6);
  EXPECT_NE(error_of(utf16).find("test.cfg: line 1 holds the byte"), std::string::npos)
      << error_of(utf16);
}

// An unknown key says what it was probably meant to be: a near key (two
// edits or fewer, case aside), or the section of a key given without one.
TEST(Config, UnknownKeysNameTheKeyTheyResemble) {
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
  };
  std::string m = error_of(std::string(kGood) + "[model]\nn_layers = 2\n");
  EXPECT_TRUE(has(m, "unknown key 'model.n_layers'") && has(m, "did you mean 'model.n_layer'?")) << m;
  m = error_of(std::string(kGood) + "[modle]\nn_layer = 2\n");
  EXPECT_TRUE(has(m, "did you mean 'model.n_layer'?")) << m;
  m = error_of(std::string(kGood) + "[model]\nN_LAYER = 2\n");
  EXPECT_TRUE(has(m, "did you mean 'model.n_layer'?")) << m;
  m = error_of("n_layer = 2\n" + std::string(kGood));
  EXPECT_TRUE(has(m, "unknown key 'n_layer'") && has(m, "it is a key of [model]") &&
              has(m, "model.n_layer on the command line")) << m;
  m = error_of(kGood, {"--train.stpes=3"});
  EXPECT_TRUE(has(m, "command line: ") && has(m, "train.stpes") &&
              has(m, "did you mean 'train.steps'?")) << m;
  m = error_of(kGood, {"--steps=3"});
  EXPECT_TRUE(has(m, "it is a key of [train]") && has(m, "train.steps on the command line")) << m;
  // Nothing near: no guess.
  m = error_of(std::string(kGood) + "[model]\nfrobnicate = 2\n");
  EXPECT_TRUE(has(m, "unknown key 'model.frobnicate'") && !has(m, "did you mean")) << m;
  m = error_of(kGood, {"--train.learning_rate=1"});
  EXPECT_TRUE(has(m, "train.learning_rate") && !has(m, "did you mean")) << m;
}

TEST(Config, MicroBatchDefaultsToBatch) {
  RunConfig c = parse_run_config(std::string(kGood) + "", "t", {"--train.micro_batch_size=0"});
  EXPECT_EQ(c.train.micro_batch_size, 4);
}

TEST(Config, ErrorsNameTheKey) {
  EXPECT_NE(error_of(std::string(kGood) + "[model]\nn_layerz = 1\n").find("model.n_layerz"), std::string::npos);
  EXPECT_NE(error_of(kGood, {"--train.nope=1"}).find("train.nope"), std::string::npos);
  EXPECT_NE(error_of(kGood, {"--model.n_head=abc"}).find("model.n_head"), std::string::npos);
  EXPECT_NE(error_of(kGood, {"--model.n_head=3"}).find("model.n_embd (16) must be divisible by model.n_head (3)"), std::string::npos);
  EXPECT_NE(error_of(kGood, {"--model.seq_len=9"}).find("model.max_seq_len"), std::string::npos);
  EXPECT_NE(error_of(kGood, {"--train.micro_batch_size=3"}).find("train.micro_batch_size"), std::string::npos);
  EXPECT_NE(error_of(kGood, {"--data.path="}).find("data.path"), std::string::npos);
  EXPECT_NE(error_of(kGood, {"--train.beta2=1"}).find("train.beta2"), std::string::npos);
  EXPECT_NE(error_of(kGood, {"stray"}).find("stray"), std::string::npos);
  EXPECT_NE(error_of("[model]\nn_embd = 1.5\n").find("model.n_embd"), std::string::npos);
  EXPECT_NE(error_of("this is not ini\n").find("test.cfg"), std::string::npos);
}

TEST(Config, MemoryLimitsAreSizesWithUnits) {
  auto bytes = [](const std::string& rank_limit) {
    return parse_run_config(kGood, "test.cfg", {"--memory.limit_per_rank=" + rank_limit})
        .memory.rank_limit_bytes;
  };
  EXPECT_EQ(bytes(""), 0u);  // no limit
  EXPECT_EQ(bytes("0"), 0u);
  EXPECT_EQ(bytes("1234"), 1234u);
  EXPECT_EQ(bytes("4e9"), 4000000000u);
  EXPECT_EQ(bytes("512M"), 512ull << 20);
  EXPECT_EQ(bytes("512MiB"), 512ull << 20);
  EXPECT_EQ(bytes(" 80 GiB "), 80ull << 30);
  EXPECT_EQ(bytes("80G"), 80ull << 30);  // as SLURM's --mem
  EXPECT_EQ(bytes("80GB"), 80000000000ull);
  EXPECT_EQ(bytes("1.5K"), 1536u);
  EXPECT_EQ(bytes("2T"), 2ull << 40);
  EXPECT_EQ(bytes("100B"), 100u);
  EXPECT_EQ(parse_run_config(kGood, "test.cfg", {"--memory.limit_per_node=1TiB"})
                .memory.node_limit_bytes,
            1ull << 40);
  for (const char* bad : {"12QB", "lots", "-5G", "inf", "1e30", "GiB", "5 G B"}) {
    const std::string e = error_of(kGood, {std::string("--memory.limit_per_rank=") + bad});
    EXPECT_NE(e.find(std::string("memory.limit_per_rank = '") + bad + "'"), std::string::npos)
        << bad << ": " << e;
  }
  EXPECT_NE(error_of(kGood, {"--memory.limit_per_node=8 parsecs"}).find("unknown unit 'parsecs'"),
            std::string::npos);
}

TEST(Config, HelpListsEveryKeyWithDefault) {
  const std::string help = run_config_help();
  for (const char* key : {"model.n_layer", "model.n_head", "model.n_embd", "model.vocab_size",
                          "model.seq_len", "train.steps", "train.batch_size",
                          "train.micro_batch_size", "train.lr", "train.warmup_steps",
                          "train.weight_decay", "train.grad_clip", "train.seed",
                          "train.log_every", "data.path", "output.dir"}) {
    EXPECT_NE(help.find(std::string("--") + key + " arg (="), std::string::npos) << key;
  }
}

// Keywords are typed where the file is read: each binds to its enum, a bad
// value names the key and every accepted value (from the enum's one name
// table), and the resolved configuration prints the names back.
TEST(Config, KeywordsBindToEnums) {
  RunConfig c = parse_run_config(std::string(kGood) +
                                     "[parallel]\nschedule = gpipe\nactivation_checkpointing = full\n"
                                     "[quant]\ntype = int8\nshare = per_rank\n",
                                 "t", {"--finetune.mode=lora", "--finetune.lora_targets= mlp-up ,qkv"});
  EXPECT_EQ(c.parallel.schedule, PipelineSchedule::gpipe);
  EXPECT_EQ(c.parallel.activation_checkpointing, Checkpointing::full);
  EXPECT_EQ(c.quant.type, quant::QuantType::int8);
  EXPECT_EQ(c.quant.share, quant::ShareMode::per_rank);
  EXPECT_EQ(c.finetune.mode, FinetuneMode::lora);
  EXPECT_EQ(slots_text(c.finetune.lora_targets), "qkv,mlp-up");
  for (const char* line : {"schedule = gpipe\n", "activation_checkpointing = full\n", "type = int8\n",
                           "share = per_rank\n", "mode = lora\n", "lora_targets = qkv,mlp-up\n"})
    EXPECT_NE(c.resolved.find(line), std::string::npos) << line;
  // The resolved text parses back to the same values.
  const RunConfig again = parse_run_config(c.resolved, "resolved", {});
  EXPECT_EQ(again.resolved, c.resolved);

  const std::string file_error = error_of(std::string(kGood) + "[parallel]\nschedule = zigzag\n");
  for (const char* part : {"test.cfg", "parallel.schedule", "'zigzag'", "gpipe | 1f1b"})
    EXPECT_NE(file_error.find(part), std::string::npos) << file_error;
  const std::string cli_error = error_of(kGood, {"--quant.type=fp16"});
  for (const char* part : {"command line", "quant.type", "'fp16'", "nf4 | int8 | f32"})
    EXPECT_NE(cli_error.find(part), std::string::npos) << cli_error;
  EXPECT_NE(error_of(kGood, {"--finetune.lora_targets=qkv,ffn"}).find("unknown target 'ffn'"),
            std::string::npos);
  EXPECT_NE(error_of(kGood, {"--finetune.lora_targets="}).find("finetune.lora_targets must name"),
            std::string::npos);
  // Llama's layers are names of the keyword, but not layers of GPT-2.
  EXPECT_NE(error_of(kGood, {"--finetune.mode=lora", "--finetune.lora_targets=qkv,q"})
                .find("finetune.lora_targets names q, which model.arch = gpt2 does not have (its "
                      "linear layers: qkv,attn-out,mlp-up,mlp-down)"),
            std::string::npos);
  EXPECT_NE(error_of(kGood, {"--parallel.stage_layers=2,0"}).find("parallel.stage_layers"),
            std::string::npos);
}

TEST(Config, HelpListsTheKeywordsFromTheirTables) {
  // --help wraps its lines: compare with every run of spaces made one.
  std::string help;
  for (char ch : run_config_help()) {
    if (ch == '\n') ch = ' ';
    if (ch == ' ' && !help.empty() && help.back() == ' ') continue;
    help += ch;
  }
  for (const char* part : {"gpipe | 1f1b", "none | full", "full | lora", "node | per_rank",
                           "nf4 (4.127 bits/weight) | int8 (8.5) | f32 (32)",
                           "qkv, attn-out, mlp-up, mlp-down"})
    EXPECT_NE(help.find(part), std::string::npos) << part;
}

// Every floating-point key must be finite: NaN and infinity are refused
// where the file is read, naming the key, whether they come from the file or
// the command line.
TEST(Config, EveryFloatKeyMustBeFinite) {
  const char* keys[] = {"train.lr",    "train.lr_min_ratio", "train.weight_decay", "train.grad_clip",
                        "train.beta1", "train.beta2",        "train.eps",          "finetune.lora_alpha"};
  for (const char* key : keys) {
    for (const char* v : {"nan", "inf", "-inf", "NaN"}) {
      const std::string msg = error_of(kGood, {std::string("--") + key + "=" + v});
      EXPECT_NE(msg.find(std::string(key) + " = "), std::string::npos) << key << "=" << v << ": " << msg;
      EXPECT_NE(msg.find("finite"), std::string::npos) << key << "=" << v << ": " << msg;
    }
  }
  const std::string train_eps = error_of(std::string(kGood) + "[train]\neps = inf\n");
  EXPECT_NE(train_eps.find("train.eps = inf"), std::string::npos) << train_eps;
}

// Ranges: the documented interval of each key, checked at parse time.
TEST(Config, ValuesOutsideTheirRangeNameTheKey) {
  struct Case {
    const char* arg;
    const char* expect;
  };
  const Case cases[] = {
      {"--train.seed=-1", "train.seed = -1: must lie in [0, 2^63 - 1]"},
      {"--train.beta1=1", "train.beta1 = 1: must lie in [0, 1)"},
      {"--train.beta2=-0.1", "train.beta2"},
      {"--train.eps=0", "train.eps = 0: must lie in (0, 1]"},
      {"--train.lr=100", "train.lr = 100"},
      {"--runtime.threads=100000", "runtime.threads = 100000: must lie in [0, 4096]"},
      {"--model.vocab_size=2147483647", "model.vocab_size = 2147483647"},
      {"--model.n_embd=1073741824", "model.n_embd = 1073741824"},
      {"--train.batch_size=2147483646", "train.batch_size = 2147483646"},
      {"--model.n_layer=100000", "model.n_layer = 100000: must lie in [1, 1024]"},
      {"--parallel.zero_stage=3", "parallel.zero_stage = 3"},
      {"--finetune.lora_rank=0", "finetune.lora_rank = 0"},
      {"--debug.fail_rank=-2", "debug.fail_rank = -2"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(kGood, {c.arg});
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.arg << ": " << msg;
  }
  // The bounds themselves are accepted.
  EXPECT_EQ(error_of(kGood, {"--train.seed=9223372036854775807"}), "");
  EXPECT_EQ(error_of(kGood, {"--train.beta1=0", "--train.lr_min_ratio=1"}), "");
}

TEST(Config, FailRankMustBeARankOfTheJob) {
  EXPECT_NE(error_of(kGood, {"--debug.fail_rank=1"}).find("debug.fail_rank (1) is not a rank"),
            std::string::npos);
  EXPECT_EQ(error_of(kGood, {"--debug.fail_rank=0"}), "");
}

// Sizes within each key's range can still overflow together: the product is
// refused in checked 64-bit arithmetic, naming the keys, instead of wrapping.
TEST(Config, SizeProductsThatOverflowNameTheirKeys) {
  const std::string msg = error_of(
      kGood, {"--model.seq_len=1048576", "--model.max_seq_len=1048576",
              "--train.batch_size=1048576", "--train.micro_batch_size=1048576"});
  EXPECT_NE(msg.find("does not fit in 64 bits"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.seq_len"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.micro_batch_size"), std::string::npos) << msg;
  // Large but representable sizes parse (the memory check comes later, with
  // the machine known).
  EXPECT_EQ(error_of(kGood, {"--model.vocab_size=16777216", "--model.n_embd=131072",
                             "--model.n_head=2"}),
            "");
}

// Boost.Program_options fills the "%name%" tokens of its messages until none
// is left: a value that holds one once made the parser loop forever.
TEST(Config, ValuesHoldingMessageTokensDoNotHang) {
  EXPECT_NE(error_of(kGood, {"--parallel.schedule=%value%"}).find("parallel.schedule"),
            std::string::npos);
  EXPECT_NE(error_of(kGood, {"--train.lr=%canonical_option%"}).find("train.lr"), std::string::npos);
  EXPECT_NE(error_of(std::string(kGood) + "[parallel]\nschedule = %hint%\n").find("%hint%"),
            std::string::npos);
}

// runtime.backend = cuda: any layout, full training or LoRA; a build without
// the CUDA backend refuses it by name. comm.device = nccl is taken on both
// (the emulated device's is an emulation of NCCL's order).
TEST(Config, TheCudaBackendTrainsEveryLayout) {
  for (const char* b : {"--runtime.backend=emulated", "--runtime.backend=cuda"}) {
    const bool cuda = std::string(b).ends_with("cuda");
    if (cuda && !backend_caps(ComputeBackend::cuda).built) continue;
    EXPECT_EQ(error_of(kGood, {b, "--parallel.dp=2", "--parallel.pp=2", "--parallel.zero_stage=2",
                               "--parallel.schedule=gpipe"}, 4),
              "");
    EXPECT_EQ(error_of(kGood, {b, "--comm.device=nccl"}), "");
    EXPECT_EQ(error_of(kGood, {b, "--comm.device=host"}), "");
    EXPECT_EQ(error_of(kGood, {b, "--finetune.mode=lora", "--quant.broadcast=nccl"}), "");
  }
  // The CPU has no GPUs to carry the base between the node leaders.
  const std::string cpu = error_of(kGood, {"--finetune.mode=lora", "--quant.broadcast=nccl"});
  EXPECT_NE(cpu.find("quant.broadcast = nccl: runtime.backend = cpu has no GPUs"),
            std::string::npos)
      << cpu;
  if (backend_caps(ComputeBackend::cuda).built) {
    EXPECT_EQ(error_of(kGood, {"--runtime.backend=cuda"}), "");
    EXPECT_EQ(error_of(kGood, {"--runtime.backend=cuda", "--finetune.mode=lora"}), "");
    EXPECT_EQ(error_of(kGood, {"--runtime.backend=cuda", "--finetune.mode=lora",
                               "--train.precision=bf16"}),
              "");
  } else {
    const std::string msg = error_of(kGood, {"--runtime.backend=cuda"});
    EXPECT_NE(msg.find("built without the CUDA backend"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of(kGood, {"--runtime.backend=gpu"}).find("runtime.backend"), std::string::npos);
}

// train.attention: auto, probabilities or flash; flash on a GPU needs 16-bit
// tiles and a head size its kernel covers.
TEST(Config, AttentionAutoIsTheProbabilitiesAndFlashOnAGpuNeeds16Bits) {
  EXPECT_EQ(parse_run_config(kGood, "test.cfg", {}).train.attention, Attention::probabilities);
  EXPECT_EQ(parse_run_config(kGood, "test.cfg", {"--train.attention=flash"}).train.attention,
            Attention::flash);
  EXPECT_EQ(error_of(kGood, {"--train.attention=flash", "--train.precision=bf16"}), "");
  EXPECT_NE(error_of(kGood, {"--train.attention=fused"}).find("train.attention"), std::string::npos);
  if (backend_caps(ComputeBackend::cuda).built) {
    // kGood's heads are 16 / 2 = 8 wide; one head of 16 is covered at bf16 or
    // fp16, not at fp32.
    std::string msg = error_of(kGood, {"--runtime.backend=cuda", "--train.attention=flash",
                                       "--train.precision=bf16"});
    EXPECT_NE(msg.find("got 16 / 2"), std::string::npos) << msg;
    EXPECT_EQ(error_of(kGood, {"--runtime.backend=cuda", "--train.attention=flash",
                               "--train.precision=fp16", "--model.n_head=1"}),
              "");
    msg = error_of(kGood, {"--runtime.backend=cuda", "--train.attention=flash", "--model.n_head=1"});
    EXPECT_NE(msg.find("train.precision = bf16 or fp16 (got fp32)"), std::string::npos) << msg;
  }
}

// What each backend can do is known without a device (train/backend.h): the
// run's checks and the work sizes of the model ask this, not the kind.
TEST(Config, BackendCapsAnswerWithoutADevice) {
  const BackendCaps& cpu = backend_caps(ComputeBackend::cpu);
  const BackendCaps& gpu = backend_caps(ComputeBackend::cuda);
  EXPECT_EQ(cpu.kind, ComputeBackend::cpu);
  EXPECT_EQ(gpu.kind, ComputeBackend::cuda);
  EXPECT_TRUE(cpu.built);
  EXPECT_FALSE(cpu.device_memory);
  EXPECT_TRUE(gpu.device_memory);
  // The emulated device: the CUDA backend's memory and work sizes, the
  // CPU's arithmetic and attention.
  const BackendCaps& emulated = backend_caps(ComputeBackend::emulated);
  EXPECT_EQ(emulated.kind, ComputeBackend::emulated);
  EXPECT_TRUE(emulated.built);
  EXPECT_TRUE(emulated.device_memory);
  EXPECT_FALSE(emulated.device_workspace);
  EXPECT_TRUE(gpu.device_workspace);
  EXPECT_FALSE(emulated.native_16bit_gemm);
  EXPECT_EQ(emulated.qtile_rows, gpu.qtile_rows);
  EXPECT_TRUE(emulated.flash_attention(ops::Precision::fp32, 8));
  EXPECT_TRUE(cpu.openblas_warm_up);
  EXPECT_FALSE(gpu.openblas_warm_up);
  EXPECT_FALSE(cpu.native_16bit_gemm);
  EXPECT_TRUE(gpu.native_16bit_gemm);
  EXPECT_NE(std::string(gpu.missing_build).find("-DMESHLM_CUDA=ON"), std::string::npos);
  // The CPU's flash attention runs at any precision and head size; the
  // GPU's needs 16-bit tiles and a head size its kernel covers.
  EXPECT_TRUE(cpu.flash_attention(ops::Precision::fp32, 8));
  EXPECT_FALSE(gpu.flash_attention(ops::Precision::fp32, 64));
  EXPECT_TRUE(gpu.flash_attention(ops::Precision::bf16, 64));
  EXPECT_FALSE(gpu.flash_attention(ops::Precision::bf16, 8));
  // The model's work sizes follow the backend's (Engine::plan_of).
  RunConfig c = parse_run_config(kGood, "test.cfg", {});
  const RankPlan on_cpu = Engine::plan_of(c, {});
  EXPECT_EQ(on_cpu.model.qtile_rows, cpu.qtile_rows);
  EXPECT_FALSE(on_cpu.model.whole_classifier_tile);
  EXPECT_EQ(on_cpu.model.classifier_rows, 0);
  c.runtime.backend = ComputeBackend::cuda;
  const RankPlan on_gpu = Engine::plan_of(c, {});
  EXPECT_EQ(on_gpu.model.qtile_rows, gpu.qtile_rows);
  EXPECT_GT(on_gpu.model.qtile_rows, 0);
  EXPECT_TRUE(on_gpu.model.whole_classifier_tile);
  EXPECT_EQ(size_t(on_gpu.model.classifier_rows),
            std::max<size_t>(1, gpu.classifier_chunk_floats / size_t(c.model.padded_vocab_size())));
}
