#include "load/base_loader.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <tuple>

#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/kept.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/timer.h"
#include "load/base_source.h"
#include "io/h5.h"
#include "io/hash.h"
#include "io/quant_cache.h"
#include "quant/formats.h"
#include "quant/qlinear.h"

namespace meshlm::load {

using namespace quant;  // the formats and the store this loader fills

namespace {
constexpr size_t kStoreAlign = 64;
// What rank 0 tells the node leaders first.
constexpr int32_t kFailed = 0, kFromCache = 1, kStreamed = 2;

// The cache key's settings: everything that changes the bytes of the store.
io::CacheKey cache_key(const GPTConfig& cfg, const QuantConfig& q, const BaseSource& src) {
  io::CacheKey key;
  const std::vector<std::string> files = src.files();
  key.source_hash = files.empty() ? io::xxh3_128_hex(src.describe().data(), src.describe().size())
                                  : files_hash(files);
  key.settings = {
      {"quant_type", name_of(q.type)},
      {"q8_block", std::to_string(quant_format(QuantType::int8).block)},
      {"nf4_block", std::to_string(quant_format(QuantType::nf4).block)},
      {"nf4_absmax_block", std::to_string(quant_format(QuantType::nf4).absmax_group)},
      {"model", "n_layer=" + std::to_string(cfg.n_layer) + " n_head=" + std::to_string(cfg.n_head) +
                    " n_embd=" + std::to_string(cfg.n_embd) + " vocab_size=" +
                    std::to_string(cfg.vocab_size) + " max_seq_len=" + std::to_string(cfg.max_seq_len)},
  };
  return key;
}
// Gives back to the system what reading and quantizing freed: HDF5's free
// lists and the heap glibc would keep for reuse. Rank 0 holds the node's
// copy; memory it no longer uses must not count against the node.
void release_freed_memory() {
  io::h5::release_free_lists();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}
}  // namespace

const StoreEntry& StoreManifest::at(const std::string& name) const {
  for (const StoreEntry& e : entries)
    if (e.spec.name == name) return e;
  throw RankError("no tensor named '" + name + "' in the quantized base model", MESHLM_HERE);
}

int64_t source_block_rows(const StoreEntry& e) {
  const QuantFormat& f = quant_format(e.type);
  return rows_per_block(e.spec, kSourceBlockBytes / sizeof(float),
                        static_cast<size_t>(std::max(f.block, 1)));
}

namespace {

// The pages of entry e a rank holding `shard` reads, as store_pages_read
// counts them: the first and the last, and how many.
struct TensorPages {
  size_t first = 0, last = 0, count = 0;
};

TensorPages tensor_pages_read(const StoreEntry& e, const ParamSpec& p, const ModelShard& shard,
                              int seq_len, size_t page) {
  // The pages read, as runs [first, last] of page numbers: the runs of one
  // array arrive in increasing order and mostly touch the previous one (row
  // after row), so each array extends a run of its own while it can; the
  // runs are merged at the end. (A bitmap of the store's pages, marked page
  // by page, took a minute to plan 8 ranks of an 8B model.)
  std::vector<std::pair<size_t, size_t>> runs;
  std::vector<std::pair<size_t, size_t>> open(static_cast<size_t>(e.layout.narrays),
                                              {1, 0});  // per array, empty
  auto mark = [&](int array, size_t first_byte, size_t last_byte) {  // inclusive
    const size_t a = first_byte / page, b = last_byte / page;
    auto& r = open[static_cast<size_t>(array)];
    if (r.first <= r.second && a >= r.first && a <= r.second + 1) {
      r.second = std::max(r.second, b);
      return;
    }
    if (r.first <= r.second) runs.push_back(r);
    r = {a, b};
  };
  const bool matrix = p.full_shape.ndim == 2;
  const int64_t R = matrix ? p.full_shape[0] : p.full_shape.numel(), K = matrix ? p.full_shape[1] : 1;
  const quant::QSlice part{.t = {}, .R = R, .K = K, .tp_dim = p.tp_dim, .tp_parts = p.tp_parts,
                           .tp_rank = shard.tp_rank, .tp_size = shard.tp_size};
  // wpe is not split; its first seq_len rows are read.
  const int64_t rows = p.role == ParamRole::position_embedding ? std::min<int64_t>(R, seq_len)
                                                               : part.local_rows();
  // Of each array: its place in the store, its element's bytes and the
  // elements of the tensor per element of the array: one (f32, int8 data),
  // two (nf4 data: 4 bits each), a block (absmax), a group of blocks (nf4's
  // absmax2); any other array is read whole.
  struct Array {
    size_t begin, count, elem, per;
  };
  std::vector<Array> arrays;
  for (int k = 0; k < e.layout.narrays; ++k) {
    const quant::QArray& arr = e.layout.arrays[k];
    const std::string_view name = arr.name;
    const size_t per = name == "data"      ? (e.layout.type == QuantType::nf4 ? 2 : 1)
                       : name == "absmax"  ? size_t(e.layout.type == QuantType::nf4
                                                        ? quant::kNF4Block
                                                        : quant::kQ8Block)
                       : name == "absmax2" ? size_t(quant::kNF4Block) * quant::kNF4AbsmaxBlock
                                           : e.layout.n;
    arrays.push_back({e.offset + arr.offset, arr.count, dtype_size(arr.elem), per});
  }
  // Elements [a, b) of the logical tensor: the bytes they take in each array.
  auto run = [&](int64_t a, int64_t b) {
    for (size_t k = 0; k < arrays.size(); ++k) {
      const Array& arr = arrays[k];
      if (arr.count == 0) continue;
      const size_t lo = std::min(size_t(a) / arr.per, arr.count - 1);
      const size_t hi = std::min(size_t(b - 1) / arr.per, arr.count - 1);
      mark(static_cast<int>(k), arr.begin + lo * arr.elem, arr.begin + (hi + 1) * arr.elem - 1);
    }
  };
  // The rank's rows as runs of consecutive logical rows (first, count):
  // under a split of the rows, a piece of each of the tensor's tp_parts
  // parts; else [0, rows).
  std::vector<std::pair<int64_t, int64_t>> row_runs;
  if (part.tp_dim == 0 && shard.tp_size > 1) {
    const int64_t piece = R / part.tp_parts / shard.tp_size;
    for (int64_t i = 0; i < rows; i += piece)
      row_runs.emplace_back(part.logical_index(i), std::min(piece, rows - i));
  } else {
    row_runs.emplace_back(0, rows);
  }
  // Split columns: the runs (first column, length) of this rank's part of a
  // row, the same in every row.
  std::vector<std::pair<int64_t, int64_t>> col_runs;
  if (part.tp_dim == 1 && shard.tp_size > 1) {
    const int64_t cols = part.local_cols();
    for (int64_t j = 0; j < cols;) {
      const int64_t c = part.logical_index(j);
      int64_t len = 1;
      while (j + len < cols && part.logical_index(j + len) == c + len) ++len;
      col_runs.emplace_back(c, len);
      j += len;
    }
  }
  for (const auto& [r0, n] : row_runs) {
    if (n == 0) continue;
    if (col_runs.empty()) {  // whole rows: one run
      run(r0 * K, (r0 + n) * K);
      continue;
    }
    for (int64_t r = r0; r < r0 + n; ++r)
      for (const auto& [c, len] : col_runs) run(r * K + c, r * K + c + len);
  }
  for (const auto& r : open)
    if (r.first <= r.second) runs.push_back(r);
  std::sort(runs.begin(), runs.end());
  TensorPages t;
  size_t next = 0;  // the first page not yet counted
  for (const auto& [a, b] : runs) {
    if (b < next) continue;
    t.count += b + 1 - std::max(a, next);
    next = b + 1;
  }
  if (!runs.empty()) t.first = runs.front().first, t.last = next - 1;
  return t;
}

}  // namespace

size_t store_pages_read(const StoreManifest& m, const GPTConfig& cfg, const ModelShard& shard,
                        int seq_len, size_t page) {
  // Each tensor's pages, kept for the next shard that holds the same part of
  // it (the planner weighs hundreds of pipeline splits): its place, format
  // and shape, its split and the rank's part of it decide them.
  using Key = std::tuple<size_t, QuantType, size_t, int64_t, int64_t, int, int, ParamRole, int, int>;
  thread_local KeptValues<std::pair<int, size_t>, Key, TensorPages> kept(1 << 16);
  std::vector<std::pair<size_t, TensorPages>> read;  // (offset in the store, pages)
  for (const ParamSpec& p : *shared_param_table(cfg, shard)) {
    // The manifest lists the whole model's tensors in the table's order.
    const auto i = static_cast<size_t>(p.index);
    const StoreEntry& e =
        i < m.entries.size() && m.entries[i].spec.name == p.name ? m.entries[i] : m.at(p.name);
    const Key key{e.offset, e.type, e.layout.n, p.full_shape[0],
                  p.full_shape.ndim == 2 ? p.full_shape[1] : 1, p.tp_dim, p.tp_parts, p.role,
                  shard.tp_rank, shard.tp_size};
    read.emplace_back(e.offset, kept.get({seq_len, page}, key, [&] {
      return tensor_pages_read(e, p, shard, seq_len, page);
    }));
  }
  // The tensors lie one after another in the store, each reading at least
  // one page of its own bytes: pages are counted twice only where a tensor's
  // last page is the next one's first (a page that spans several small
  // tensors is such a page for each pair of them).
  std::sort(read.begin(), read.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t pages = 0;
  for (size_t i = 0; i < read.size(); ++i) {
    if (i > 0 && read[i].first == read[i - 1].first) continue;  // one tensor named twice
    pages += read[i].second.count;
    if (i > 0 && read[i - 1].second.last == read[i].second.first) --pages;
  }
  return pages * page;
}

StoreManifest make_manifest(const GPTConfig& cfg, QuantType matrices) {
  StoreManifest m;
  size_t offset = 0;
  for (const ParamSpec& p : model_param_table(cfg)) {
    StoreEntry e;
    e.spec = p;
    e.type = p.full_shape.ndim >= 2 ? matrices : QuantType::f32;
    const size_t n = static_cast<size_t>(p.full_shape.numel());
    e.layout = qlayout(e.type, n);
    e.offset = offset;
    offset += (e.layout.total_bytes + kStoreAlign - 1) / kStoreAlign * kStoreAlign;
    m.staging_floats = std::max(m.staging_floats, source_block_rows(e) * row_floats(p));
    m.absmax_bytes = std::max(m.absmax_bytes, BlockQuantizer::absmax_bytes(e.type, n));
    m.entries.push_back(std::move(e));
  }
  m.bytes = offset;
  return m;
}

std::vector<io::CacheTensor> cache_layout(const StoreManifest& m) {
  std::vector<io::CacheTensor> out;
  for (const StoreEntry& e : m.entries) {
    io::CacheTensor t;
    t.name = e.spec.name;
    for (int d = 0; d < e.spec.full_shape.ndim; ++d) t.shape.push_back(e.spec.full_shape.dims[d]);
    t.format = name_of(e.type);
    for (int i = 0; i < e.layout.narrays; ++i) {
      const QArray& a = e.layout.arrays[i];
      t.arrays.push_back({a.name, a.elem, a.count, e.offset + a.offset});
    }
    out.push_back(std::move(t));
  }
  return out;
}

FillReport fill_store(const GPTConfig& cfg, const QuantConfig& q, uint64_t seed,
                      const StoreManifest& m, uint8_t* store, bool use_cache,
                      const FillHooks& hooks) {
  const double t0 = now_seconds();
  FillReport rep;
  std::unique_ptr<BaseSource> src = open_base_source(q.base, cfg, seed);
  const bool cached = use_cache && !q.cache.empty();
  io::CacheKey key;
  std::vector<io::CacheTensor> layout;
  rep.cache = "off";
  if (cached) {
    key = cache_key(cfg, q, *src);
    layout = cache_layout(m);
    const io::CacheLookup look = io::read_quant_cache(q.cache, key, layout, store, m.bytes);
    if (look.status == io::CacheStatus::hit) {
      if (hooks.on_start) hooks.on_start(true);
      rep.cache_hit = true;
      rep.cache = "hit (" + q.cache + ")";
      release_freed_memory();
      rep.seconds = now_seconds() - t0;
      return rep;
    }
    // meshlm replaces only its own caches: anything else at the path stays.
    if (look.status == io::CacheStatus::foreign)
      throw RankError("quant.cache: " + look.reason +
                          "; meshlm replaces only its own caches (remove the file or name another)",
                      MESHLM_HERE);
    if (look.status == io::CacheStatus::corrupt)
      log::warn("quant.cache: {}; quantizing again and replacing it", look.reason);
    else
      log::info("# quant.cache: {}; quantizing", look.reason);
    rep.cache = "miss (" + look.reason + ")";
  }
  if (hooks.on_start) hooks.on_start(false);
  {
    // The only full-precision values held: one block of rows at a time.
    Buffer staging(m.staging_floats * sizeof(float), MemCategory::workspace, "quant.source_rows");
    float* rows = staging.as<float>();
    ProgressBar bar(std::string("quantize ") + name_of(q.type), m.entries.size());
    for (size_t i = 0; i < m.entries.size(); ++i) {
      const StoreEntry& e = m.entries[i];
      BlockQuantizer quantizer(qtensor_at(e.layout, store + e.offset));
      const int64_t total = e.spec.full_shape[0], step = source_block_rows(e);
      const size_t rf = row_floats(e.spec);
      for (int64_t r0 = 0; r0 < total; r0 += step) {
        const int64_t nr = std::min(step, total - r0);
        src->read_rows(e.spec, r0, nr, rows);
        quantizer.add(rows, static_cast<size_t>(r0) * rf, static_cast<size_t>(nr) * rf);
      }
      quantizer.finish();
      if (hooks.on_tensor) hooks.on_tensor(e);
      bar.update(i + 1, e.spec.name);
    }
    bar.finish();
  }
  if (cached) {
    io::write_quant_cache(q.cache, key, layout, store, m.bytes);
    rep.cache += "; written to " + q.cache;
  }
  release_freed_memory();
  rep.seconds = now_seconds() - t0;
  return rep;
}

std::unique_ptr<FrozenBase> FrozenBase::load(const GPTConfig& cfg, const QuantConfig& q,
                                             uint64_t seed, const ProcessMesh& mesh,
                                             const DeviceBroadcast* over_device) {
  const double t0 = now_seconds();
  std::unique_ptr<FrozenBase> b(new FrozenBase);
  b->manifest_ = make_manifest(cfg, q.type);
  const size_t bytes = b->manifest_.bytes;
  MPI_Comm world = mesh.world();
  if (q.share == ShareMode::per_rank) {
    b->store_ = NodeStore::private_copy(bytes);
    try_all(world, "quant.base: ", [&] {
      b->report_ = fill_store(cfg, q, seed, b->manifest_, b->store_->data(), /*use_cache=*/false);
    }, MESHLM_HERE);
  } else {
    b->store_ = NodeStore::shared(mesh.node(), bytes);
    uint8_t* store = b->store_->data();
    // World rank 0 is rank 0 of its node and of the leaders.
    std::unique_ptr<comm::Communicator> leaders;
    if (mesh.node_leaders() != MPI_COMM_NULL) leaders = comm::make_mpi_communicator(mesh.node_leaders());
    auto send_flag = [&](int32_t flag) {
      leaders->broadcast(&flag, 1, DType::i32, 0).wait();
      return flag;
    };
    auto send_bytes = [&](uint8_t* p, size_t n) {
      if (over_device == nullptr) {
        leaders->broadcast(p, n, DType::u8, 0).wait();
        return;
      }
      // Through the leaders' GPUs, a chunk at a time.
      const DeviceBroadcast& d = *over_device;
      const bool root = mesh.rank() == 0;
      for (size_t done = 0; done < n; done += d.chunk_bytes) {
        const size_t k = std::min(d.chunk_bytes, n - done);
        if (root) d.device->to_device(d.chunk, p + done, k, nullptr);
        d.leaders->broadcast(d.chunk, k, DType::u8, 0).wait();
        if (!root) d.device->to_host(p + done, d.chunk, k, nullptr);
      }
    };
    // Rank 0 tells the leaders first whether the store comes from the cache
    // (then all of it follows) or from the source (then each tensor follows
    // as soon as it is quantized, behind a flag that says whether it could
    // be). A failure on rank 0 therefore never leaves a leader waiting for
    // bytes; it reaches every rank through the check_all below.
    std::string error;
    if (mesh.rank() == 0) {
      int32_t mode = kFailed;
      size_t sent = 0;  // tensors streamed
      FillHooks hooks;
      hooks.on_start = [&](bool hit) { mode = send_flag(hit ? kFromCache : kStreamed); };
      hooks.on_tensor = [&](const StoreEntry& e) {
        send_flag(1);
        send_bytes(store + e.offset, e.layout.total_bytes);
        ++sent;
      };
      bool cache_sent = false;
      try {
        b->report_ = fill_store(cfg, q, seed, b->manifest_, store, /*use_cache=*/true, hooks);
        if (mode == kFromCache) {
          cache_sent = true;
          send_bytes(store, bytes);
        }
      } catch (const std::exception& e) {
        // Finish the message the leaders are in the middle of; the error
        // itself goes to every rank below.
        error = e.what();
        if (mode == kFailed) send_flag(kFailed);
        if (mode == kFromCache && !cache_sent) send_bytes(store, bytes);
        if (mode == kStreamed && sent < b->manifest_.entries.size()) send_flag(0);
      }
    } else if (leaders) {
      const int32_t mode = send_flag(kFailed);
      if (mode == kFromCache) send_bytes(store, bytes);
      if (mode == kStreamed) {
        for (const StoreEntry& e : b->manifest_.entries) {
          if (!send_flag(0)) break;
          send_bytes(store + e.offset, e.layout.total_bytes);
        }
      }
    }
    leaders.reset();
    check_all(world, error.empty(), "quant: " + error, MESHLM_HERE);
    b->store_->publish();
  }
  b->seconds_ = now_seconds() - t0;
  return b;
}

QTensor FrozenBase::tensor(const ParamSpec& spec) const {
  // The manifest lists the whole model's table in order.
  const StoreEntry& e = manifest_.entries.at(static_cast<size_t>(spec.index));
  MESHLM_CHECK(e.spec.name == spec.name, spec.name + " is not a tensor of the GPT-2 table");
  return qtensor_at(e.layout, store_->data() + e.offset);
}

}  // namespace meshlm::load
