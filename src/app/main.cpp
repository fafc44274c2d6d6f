// meshlm: train GPT-2 language models with MPI.
//
//   meshlm train FILE.cfg [--section.key=value ...]
//   meshlm quantize FILE.cfg [--section.key=value ...]
//   meshlm tokenize IN [IN ...] OUT.h5 [--tokenizer FILE ...]
//   meshlm ckpt inspect|stats|diff|verify|export|import ...
//   meshlm generate MODEL (--prompt TEXT | --prompt-ids 1,2,3) [...]
//
// Error contract (core/error.h): a CollectiveError (every rank fails the same
// way, e.g. a bad parameter file) is printed once by rank 0 and every rank
// exits 1; any other error is printed with its rank and aborts the job, so a
// failure on one rank never leaves the others waiting in a collective.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "app/ckpt.h"
#include "app/generate.h"
#include "app/plan.h"
#include "app/tokenize.h"
#include "app/parameter_file.h"
#include "comm/mpi_session.h"
#include "core/alloc.h"
#include "comm/errors.h"
#include "core/error.h"
#include "core/log.h"
#include "io/tokens.h"
#include "load/base_loader.h"
#include "train/report.h"
#include "train/trainer.h"

namespace {

const char* kUsage =
    "usage: meshlm <command> [args]\n"
    "\n"
    "commands:\n"
    "  train FILE.cfg [--section.key=value ...]   train a model from a parameter file\n"
    "  quantize FILE.cfg [--section.key=value]    build the quantized base model's cache (quant.cache) ahead of a run\n"
    "  tokenize IN [IN ...] OUT.h5 [options]      a corpus to a token file with a model's tokenizer (meshlm tokenize --help)\n"
    "  ckpt TOOL ARGS                             inspect, stats, diff, verify, export, import checkpoints (meshlm ckpt --help)\n"
    "  plan FILE.cfg --ranks N --ranks-per-node G the layouts of N ranks that fit, fastest first (meshlm plan --help)\n"
    "  generate MODEL --prompt TEXT|--prompt-ids  continue a prompt with a model, KV-cached, on the CPU (meshlm generate --help)\n"
    "  help [train]                               this text, or every parameter of train\n"
    "  version                                    print the version\n"
    "\n"
    "Launch under MPI: mpiexec -n 4 meshlm train inputs/demo.cfg\n";

void print_train_help() {
  std::printf(
      "usage: meshlm train FILE.cfg [--section.key=value ...]\n"
      "\n"
      "FILE.cfg is an INI file with the sections below; any key may be given on the\n"
      "command line too, and the command line wins. Unknown keys are errors.\n"
      "\n%s",
      meshlm::run_config_help().c_str());
}

int cmd_train(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    if (meshlm::log::rank() == 0) print_train_help();
    if (args.empty())
      throw meshlm::CollectiveError("meshlm train needs a parameter file (see meshlm train --help)",
                                    MESHLM_HERE);
    return 0;
  }
  std::vector<std::string> overrides(args.begin() + 1, args.end());
  for (const auto& a : overrides) {
    if (a == "--help" || a == "-h") {
      if (meshlm::log::rank() == 0) print_train_help();
      return 0;
    }
  }
  meshlm::RunConfig cfg =
      meshlm::load_run_config(MPI_COMM_WORLD, args[0], overrides, /*choose_layout=*/true);
  meshlm::run_training(cfg, MPI_COMM_WORLD);
  return 0;
}

// Rank 0 builds quant.cache from quant.base with the run's settings (or
// finds it up to date); the other ranks wait for the result.
int cmd_quantize(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h")
    throw meshlm::CollectiveError("usage: meshlm quantize FILE.cfg [--section.key=value ...] "
                                  "(the [quant] keys of a train parameter file)",
                                  MESHLM_HERE);
  // The layout of the later run does not matter here (the cache holds the
  // whole model), and this job may have any number of ranks: dp = 1 keeps a
  // parallel.dp = 0 from being resolved against them.
  std::vector<std::string> overrides = {"--parallel.dp=1"};
  overrides.insert(overrides.end(), args.begin() + 1, args.end());
  const meshlm::RunConfig cfg = meshlm::load_run_config(MPI_COMM_WORLD, args[0], overrides);
  if (cfg.quant.cache.empty())
    throw meshlm::CollectiveError("quant.cache is empty: meshlm quantize builds that file, name it",
                                  MESHLM_HERE);
  const int rank = meshlm::log::rank();
  meshlm::try_all(MPI_COMM_WORLD, "quant: ", [&] {
    if (rank != 0) return;
    const meshlm::load::StoreManifest m = meshlm::load::make_manifest(cfg.model, cfg.quant.type);
    meshlm::log::info("# quantize: base {} -> {} {} ({} tensors, {})",
                      cfg.quant.base.empty() ? std::string(cfg.model.arch == meshlm::ModelArch::llama ? "Llama" : "GPT-2") +
                                                   " initialisation, train.seed"
                                             : cfg.quant.base,
                      meshlm::name_of(cfg.quant.type), cfg.quant.cache, m.entries.size(),
                      meshlm::format_bytes(static_cast<double>(m.bytes)));
    meshlm::Buffer store(m.bytes, meshlm::MemCategory::quantized, "quant.store");
    const meshlm::load::FillReport r = meshlm::load::fill_store(cfg.model, cfg.quant, cfg.train.seed, m,
                                                                  store.as<uint8_t>(),
                                                                  /*use_cache=*/true);
    meshlm::log::info("# quantize: {} in {:.2f} s", r.cache_hit ? "cache is up to date" : r.cache,
                      r.seconds);
  }, MESHLM_HERE);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const meshlm::comm::MpiSession mpi(&argc, &argv);
  const int rank = mpi.world_rank();
  meshlm::log::set_rank(rank);

  int status = 0;
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
    if (cmd == "train") {
      status = cmd_train(args);
    } else if (cmd == "quantize") {
      status = cmd_quantize(args);
    } else if (cmd == "ckpt") {
      status = meshlm::cmd_ckpt(args);
    } else if (cmd == "tokenize") {
      status = meshlm::cmd_tokenize(MPI_COMM_WORLD, args);
    } else if (cmd == "generate") {
      status = meshlm::cmd_generate(args);
    } else if (cmd == "plan") {
      // One process plans; the other ranks of a job (if any) have nothing to
      // do, but for --calibrate's MPI figures between ranks 0 and 1.
      const std::string calibrate = meshlm::plan_calibrate_target(args);
      if (!calibrate.empty()) status = meshlm::cmd_plan_calibrate(MPI_COMM_WORLD, calibrate);
      else if (rank == 0) status = meshlm::cmd_plan(args);
    } else if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      if (rank == 0) {
        if (!args.empty() && args[0] == "train") print_train_help();
        else std::fputs(kUsage, stdout);
      }
    } else if (cmd == "version" || cmd == "--version") {
      if (rank == 0) std::printf("meshlm %s\n", MESHLM_VERSION);
    } else {
      if (rank == 0) std::fputs(kUsage, stderr);
      throw meshlm::CollectiveError(cmd.empty() ? "no command given" : "unknown command '" + cmd + "'",
                                    MESHLM_HERE);
    }
  } catch (const meshlm::CollectiveError& e) {
    meshlm::fatal_all(MPI_COMM_WORLD, e.what(), e.file(), e.line());
  } catch (const meshlm::Error& e) {
    meshlm::fatal_one(e.what(), e.file(), e.line());
  } catch (const std::exception& e) {
    meshlm::fatal_one(e.what(), __FILE__, __LINE__);
  }
  return status;
}
