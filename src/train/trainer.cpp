#include "train/trainer.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/run_log.h"
#include "io/tokens.h"
#include "model/gpt.h"
#include "plan/memory.h"
#include "train/adamw.h"
#include "train/report.h"
#include "train/schedule.h"

namespace meshlm {

int configure_threads(int requested, MPI_Comm comm) {
  int threads = requested;
  if (threads <= 0) {
    // Ranks sharing this node split its cores; omp_get_num_procs() honours
    // the CPU set given by the launcher (srun --cpus-per-task, taskset).
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    threads = std::max(1, omp_get_num_procs() / local);
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  return threads;
}

namespace {

// Collective: makes sure data.path exists, tokenizing data.tokenize_from on
// rank 0 when it does not, and opens the token file on every rank.
io::TokenReader open_training_data(const DataConfig& d, int vocab_size, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  namespace fs = std::filesystem;
  try_all(comm, "data.tokenize_from: ", [&] {
    if (rank != 0 || fs::exists(d.path) || d.tokenize_from.empty()) return;
    log::info("# tokenizing {} -> {} (byte-level, vocabulary 256)", d.tokenize_from, d.path);
    const uint64_t n = io::tokenize_bytes(d.tokenize_from, d.path);
    log::info("# {} tokens written", n);
  }, MESHLM_HERE);
  std::unique_ptr<io::TokenReader> reader;
  try_all(comm, "data.path: ", [&] {
    if (!fs::exists(d.path))
      throw RankError("token file '" + d.path + "' does not exist", MESHLM_HERE);
    reader = std::make_unique<io::TokenReader>(io::TokenReader::open(d.path));
    // A file that declares a larger vocabulary than the model's is refused
    // before anything is trained or written; files without the attribute
    // are checked batch by batch as they are read.
    const int64_t declared = reader->vocab_size_attr();
    if (declared > vocab_size)
      throw RankError("token file '" + d.path + "' declares vocab_size " + std::to_string(declared) +
                          " (attribute), larger than model.vocab_size = " + std::to_string(vocab_size),
                      MESHLM_HERE);
  }, MESHLM_HERE);
  return std::move(*reader);
}

// Collective: one line per rank (host, threads), gathered to rank 0 and
// printed in rank order.
void print_rank_lines(int threads, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  constexpr int kHostLen = 64;
  char host[kHostLen] = {0};
  gethostname(host, kHostLen - 1);
  std::vector<char> hosts(rank == 0 ? static_cast<size_t>(size) * kHostLen : 0);
  std::vector<int> thr(rank == 0 ? size : 0);
  MPI_Gather(host, kHostLen, MPI_CHAR, hosts.data(), kHostLen, MPI_CHAR, 0, comm);
  MPI_Gather(&threads, 1, MPI_INT, thr.data(), 1, MPI_INT, 0, comm);
  for (int r = 0; r < static_cast<int>(thr.size()); ++r)
    log::info("#  rank {:>4} | host {:<20} | device cpu | threads {}", r,
              std::string(&hosts[static_cast<size_t>(r) * kHostLen]), thr[r]);
}

}  // namespace

TrainSummary run_training(const RunConfig& cfg, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const double t_start = now_seconds();
  SectionTimers timers;
  const TrainConfig& tc = cfg.train;

  const int threads = configure_threads(cfg.runtime.threads, comm);
  log::info("# meshlm {} | {} rank(s) | parameter file {}", MESHLM_VERSION, size, cfg.source);
  print_rank_lines(threads, comm);

  io::TokenReader data = open_training_data(cfg.data, cfg.model.vocab_size, comm);
  const int B = tc.micro_batch_size, T = tc.seq_len, accum = tc.grad_accum_steps();
  std::unique_ptr<io::BatchLoader> loader;
  try_all(comm, "data.path: ", [&] {
    loader = std::make_unique<io::BatchLoader>(data, B, T, cfg.data.shuffle, tc.seed,
                                               cfg.model.vocab_size);
  }, MESHLM_HERE);
  log::info("# data: {} ({} tokens, {} sequences of {} per epoch)", cfg.data.path, data.size(),
            loader->windows_per_epoch(), T);

  const MemoryByCategory predicted = predict_memory(cfg.model, B, T, loader->windows_per_epoch(),
                                                    cfg.data.shuffle);
  log::info("# memory predicted per rank: {} (params {}, grads {}, optimizer {}, activations {})",
            format_bytes(total(predicted)), format_bytes(at(predicted, MemCategory::params)),
            format_bytes(at(predicted, MemCategory::grads)),
            format_bytes(at(predicted, MemCategory::optimizer)),
            format_bytes(at(predicted, MemCategory::activations)));

  GPT model(cfg.model);
  model.init_weights(tc.seed);
  AdamW opt(model.table(), {static_cast<float>(tc.beta1), static_cast<float>(tc.beta2),
                            static_cast<float>(tc.eps), static_cast<float>(tc.weight_decay)});
  const LRSchedule sched{tc.lr, tc.lr_min_ratio, tc.warmup_steps, tc.steps};
  log::info("# model: GPT-2 L={} NH={} C={} V={} (padded {}) | {} parameters ({})",
            cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.vocab_size,
            cfg.model.padded_vocab_size(), model.num_params(),
            format_bytes(static_cast<double>(model.num_params()) * sizeof(float)));
  log::info("# batch: {} sequences x {} tokens = {} micro-batch(es) of {} | {} steps",
            tc.batch_size, T, accum, B, tc.steps);

  std::unique_ptr<io::RunLog> runlog;
  try_all(comm, "output.dir: ", [&] {
    if (rank == 0) runlog = std::make_unique<io::RunLog>(cfg.output.dir, cfg.resolved);
  }, MESHLM_HERE);

  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  TrainSummary summary;
  log::info("# {:>6} {:>9} {:>10} {:>10} {:>10} {:>11}", "step", "loss", "lr", "grad_norm",
            "ms/step", "tokens/s");
  for (int step = 0; step < tc.steps; ++step) {
    const double t0 = now_seconds();
    model.zero_grads();
    double loss = 0;
    for (int micro = 0; micro < accum; ++micro) {
      {
        ScopedTimer st(timers, Section::data);
        loader->next(inputs.data(), targets.data());
      }
      {
        ScopedTimer st(timers, Section::forward);
        loss += model.forward(inputs.data(), targets.data(), B, T);
      }
      {
        ScopedTimer st(timers, Section::backward);
        model.backward(1.0f / accum);
      }
    }
    loss /= accum;
    const double lr = sched.at(step);
    double norm;
    {
      ScopedTimer st(timers, Section::optimizer);
      norm = clip_grad_norm(model.grads(), model.num_params(), tc.grad_clip);
      opt.step(model.params(), model.grads(), static_cast<float>(lr));
    }
    const double dt = now_seconds() - t0;
    StepRecord r{step + 1, loss, lr, norm, dt, static_cast<double>(tc.batch_size) * T / dt};
    summary.steps.push_back(r);
    if (!std::isfinite(loss))
      throw CollectiveError("loss is " + std::to_string(loss) + " at step " +
                                std::to_string(step + 1) + "; lower train.lr or raise train.warmup_steps",
                            MESHLM_HERE);
    if ((step + 1) % tc.log_every == 0 || step + 1 == tc.steps || step == 0) {
      log::info("  {:>6} {:>9.4f} {:>10.3e} {:>10.4f} {:>10.1f} {:>11.0f}", r.step, r.loss, r.lr,
                r.grad_norm, 1e3 * r.seconds, r.tokens_per_s);
      if (runlog) runlog->append(r.step, r.loss, r.lr, r.grad_norm, r.tokens_per_s);
    }
  }
  summary.seconds = now_seconds() - t_start;
  timers.account_rest_as_other(summary.seconds);
  print_memory_table(predicted, comm);
  print_timing_table(timers, summary.seconds, comm);
  if (runlog) {
    runlog->write_memory(predicted);
    runlog->write_timing(timers);
    runlog->close();
    log::info("# run log: {}/run.h5", cfg.output.dir);
  }
  return summary;
}

}  // namespace meshlm
