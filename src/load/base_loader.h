// The frozen base model, from its source to every rank (DESIGN.md, flow 2).
//
// Rank 0 opens the source (safetensors, meshlm HDF5, or GPT-2 initialisation)
// and, unless the HDF5 cache already holds the result for the same source
// bytes and settings, streams it tensor by tensor: read a block of rows of
// one logical tensor (the only full-precision values ever held: at most
// kSourceBlockBytes), quantize it into its place in the store, next block;
// when the tensor is whole, broadcast its bytes, next tensor. The store is the node's MPI shared
// window (quant.share = node), so rank 0 writes straight into shared memory;
// each tensor's quantized bytes go to one leader per node (MPI_Bcast over
// the node leaders) as soon as they are there, and each leader receives them
// straight into its node's window (from the cache: the whole store at once).
// Every rank then reads its own TP/PP slice of each matrix from the window,
// in place.
//
// Peak host memory of a node: one quantized copy, plus (on rank 0's node)
// one block of source rows in fp32 and one tensor's nf4 absmax.
//
// quant.share = per_rank: every rank opens the source and quantizes its own
// full copy (the naive behaviour; the baseline of the measurements; the
// cache is not used).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/staged_comm.h"
#include "mesh/mesh.h"
#include "model/gpt_config.h"
#include "model/param_table.h"
#include "quant/node_store.h"
#include "quant/quant_config.h"
#include "quant/quantize.h"

namespace meshlm::io {
struct CacheTensor;
}

namespace meshlm::load {

using quant::NodeStore;
using quant::QLayout;
using quant::QTensor;
using quant::QuantConfig;
using quant::QuantType;
using quant::ShareMode;

// Every tensor of the whole model's table (logical shapes) at its place in
// the store: matrices in the chosen format, vectors in f32, each tensor's
// start aligned to 64 bytes. Every rank computes the same manifest from the
// configuration alone.
struct StoreEntry {
  ParamSpec spec;
  QuantType type;
  QLayout layout;
  size_t offset = 0;  // bytes into the store
};
struct StoreManifest {
  std::vector<StoreEntry> entries;
  size_t bytes = 0;  // of the whole store
  // What a rank that quantizes holds beside the store (workspace): one block
  // of source rows in fp32 (at most kSourceBlockBytes) and the fp32 absmax
  // of one tensor's blocks (nf4's second level), the largest of each.
  size_t staging_floats = 0;
  size_t absmax_bytes = 0;
  size_t staging_bytes() const { return staging_floats * sizeof(float) + absmax_bytes; }
  const StoreEntry& at(const std::string& name) const;
};
// The source is read and quantized this many bytes of fp32 rows at a time
// (with wte's fp32 absmax, 2.4 MiB for GPT-2's, the staging stays within a
// tenth of the store of a GPT-2 124M base: 61 MiB in nf4).
inline constexpr size_t kSourceBlockBytes = size_t{1} << 20;
// Rows of entry e read at a time: whole quantization blocks, at most
// kSourceBlockBytes (a row longer than that is one block).
int64_t source_block_rows(const StoreEntry& e);
StoreManifest make_manifest(const GPTConfig& cfg, QuantType matrices);

// Bytes of the store, in whole pages of `page` bytes, that a rank holding
// `shard` reads while it trains: of each of its base tensors the rows and
// columns of its tensor-parallel part (as quant::make_qslice splits them) in
// every array of the tensor (data, absmax, ...); of the position table the
// first seq_len rows; of the token embedding all of the rank's vocabulary
// part (the classifier reads it, and the lookup's tokens, dozens to a page,
// reach nearly every page). A rank whose node's store another rank holds
// counts these pages in its resident memory.
size_t store_pages_read(const StoreManifest& m, const GPTConfig& cfg, const ModelShard& shard,
                        int seq_len, size_t page);

// The arrays of every tensor as the cache stores them (/q/<name>/<array>).
std::vector<io::CacheTensor> cache_layout(const StoreManifest& m);

// What filling the store did, for the log.
struct FillReport {
  bool cache_hit = false;
  std::string cache;  // one sentence: "off", "hit", "miss (reason); written"
  double seconds = 0;
};

// Where the bytes are as fill_store() makes them: on_start(hit) once, when
// it is known whether they come from the cache (all at once) or from the
// source; then, from the source, on_tensor(entry) after each tensor is in
// the store.
struct FillHooks {
  std::function<void(bool hit)> on_start;
  std::function<void(const StoreEntry&)> on_tensor;
};

// One rank's work: fills `store` (m.bytes) from the cache when `use_cache`
// and it matches, otherwise from the source tensor by tensor (then writes
// the cache when one is configured). Throws RankError naming the file and
// tensor on bad input; never leaves a partial cache file.
FillReport fill_store(const GPTConfig& cfg, const QuantConfig& q, uint64_t seed,
                      const StoreManifest& m, uint8_t* store, bool use_cache,
                      const FillHooks& hooks = {});

// quant.broadcast = nccl, on a node leader: the leaders' communicator of
// device buffers (NCCL's), a chunk of device memory, and how bytes cross
// between it and the host. The store goes from rank 0's window to the
// chunk, over the leaders' GPUs, and from each leader's chunk into its
// node's window, one chunk at a time.
struct DeviceBroadcast {
  comm::Communicator* leaders = nullptr;
  const comm::DeviceAccess* device = nullptr;
  void* chunk = nullptr;
  size_t chunk_bytes = 0;
};

class FrozenBase {
public:
  // Collective over mesh.world(). Errors (a missing tensor, a bad file) are
  // CollectiveErrors on every rank: no rank waits for bytes that never come.
  // `over_device`: quant.broadcast = nccl (given on the node leaders, null
  // elsewhere); MPI_Bcast into the windows otherwise.
  static std::unique_ptr<FrozenBase> load(const GPTConfig& cfg, const QuantConfig& q,
                                          uint64_t seed, const ProcessMesh& mesh,
                                          const DeviceBroadcast* over_device = nullptr);

  // The logical tensor of `spec` (an entry of a GPT-2 table; spec.index is
  // its place in the whole model's) in the store: a view into the window.
  QTensor tensor(const ParamSpec& spec) const;
  const StoreManifest& manifest() const { return manifest_; }
  const NodeStore& store() const { return *store_; }
  const FillReport& report() const { return report_; }  // rank 0's (per_rank: this rank's)
  double seconds() const { return seconds_; }            // the whole load, on this rank

private:
  StoreManifest manifest_;
  std::unique_ptr<NodeStore> store_;
  FillReport report_;
  double seconds_ = 0;
};

}  // namespace meshlm::load
