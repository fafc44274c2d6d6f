// The run log: rows, memory and timing read back through the HDF5 C API,
// and rows that survive a process that dies without closing the file.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/timer.h"
#include "io/h5.h"
#include "io/run_log.h"
#include "scratch_dir.h"
#include "train/report.h"

namespace fs = std::filesystem;
using namespace meshlm;
using namespace meshlm::io;

namespace {

using RunLogTest = ScratchDirTest;

// Reads a whole 1-D dataset with the plain C API.
template <typename T>
std::vector<T> read_column(hid_t file, const char* name, hid_t type) {
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  EXPECT_GE(d, 0) << name;
  hid_t s = H5Dget_space(d);
  hsize_t n = 0;
  EXPECT_EQ(H5Sget_simple_extent_ndims(s), 1) << name;
  H5Sget_simple_extent_dims(s, &n, nullptr);
  std::vector<T> v(n);
  if (n > 0) EXPECT_GE(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0) << name;
  H5Sclose(s);
  H5Dclose(d);
  return v;
}

template <typename T>
T read_scalar(hid_t file, const std::string& name, hid_t type) {
  T v{};
  hid_t d = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  EXPECT_GE(d, 0) << name;
  hid_t s = H5Dget_space(d);
  EXPECT_EQ(H5Sget_simple_extent_type(s), H5S_SCALAR) << name;
  EXPECT_GE(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v), 0) << name;
  H5Sclose(s);
  H5Dclose(d);
  return v;
}

std::string read_config_attr(hid_t file) {
  hid_t a = H5Aopen(file, "config", H5P_DEFAULT);
  EXPECT_GE(a, 0);
  hid_t t = H5Aget_type(a);
  EXPECT_EQ(H5Tget_class(t), H5T_STRING);
  EXPECT_GT(H5Tis_variable_str(t), 0);
  hid_t mem = H5Tcopy(H5T_C_S1);
  H5Tset_size(mem, H5T_VARIABLE);
  H5Tset_cset(mem, H5T_CSET_UTF8);
  char* p = nullptr;
  EXPECT_GE(H5Aread(a, mem, &p), 0);
  std::string s = p ? p : "";
  H5free_memory(p);
  H5Tclose(mem);
  H5Tclose(t);
  H5Aclose(a);
  return s;
}

}  // namespace

TEST_F(RunLogTest, RowsMemoryTimingAndConfigReadBack) {
  const std::string config = "[model]\nn_layer = 2\nn_embd = 64\n\n[train]\nlr = 0.001\n";
  const std::string dir = (dir_ / "runs" / "r1").string();  // parents are created
  {
    RunLog log(dir, config);
    EXPECT_EQ(log.path(), (fs::path(dir) / "run.h5").string());
    log.append(1, 4.5, 1e-3, 0.75, 1000.0);
    log.append(2, 4.25, 2e-3, 0.5, 1100.0);
    log.append(10, 3.0, 3e-3, 0.25, 1200.0);
    EXPECT_EQ(log.rows(), 3);
    // Two ranks' figures: entry r of every dataset is rank r.
    MemoryByCategory predicted{}, current{}, peak{};
    for (int i = 0; i < kNumMemCategories; ++i) {
      predicted[i] = 1000 + i;
      current[i] = 2000 + i;
      peak[i] = 3000 + i;
    }
    MemoryByCategory peak1 = peak;
    peak1[0] = 7;
    ProcessMemory proc{10, 20, 30}, proc1{11, 21, 31};
    log.write_memory({predicted, predicted}, {current, current}, {peak, peak1}, {proc, proc1});
    SectionTimers timers;
    timers.add(Section::forward, 1.5);
    timers.add(Section::backward, 2.5);
    log.write_timing(timers);
    log.write_timing(timers);  // a second call overwrites
    log.close();
    log.close();  // idempotent
    EXPECT_THROW(log.append(11, 0, 0, 0, 0), RankError);
  }

  hid_t f = H5Fopen((fs::path(dir) / "run.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_EQ(read_config_attr(f), config);
  int32_t version = 0;
  hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
  H5Aread(a, H5T_NATIVE_INT32, &version);
  H5Aclose(a);
  EXPECT_EQ(version, 1);

  EXPECT_EQ(read_column<int64_t>(f, "/metrics/step", H5T_NATIVE_INT64),
            (std::vector<int64_t>{1, 2, 10}));
  EXPECT_EQ(read_column<double>(f, "/metrics/loss", H5T_NATIVE_DOUBLE),
            (std::vector<double>{4.5, 4.25, 3.0}));
  EXPECT_EQ(read_column<double>(f, "/metrics/lr", H5T_NATIVE_DOUBLE),
            (std::vector<double>{1e-3, 2e-3, 3e-3}));
  EXPECT_EQ(read_column<double>(f, "/metrics/grad_norm", H5T_NATIVE_DOUBLE),
            (std::vector<double>{0.75, 0.5, 0.25}));
  EXPECT_EQ(read_column<double>(f, "/metrics/tokens_per_s", H5T_NATIVE_DOUBLE),
            (std::vector<double>{1000.0, 1100.0, 1200.0}));

  auto col = [&](const std::string& name) {
    return read_column<int64_t>(f, name.c_str(), H5T_NATIVE_INT64);
  };
  for (int i = 0; i < kNumMemCategories; ++i) {
    std::string g = std::string("/memory/") + mem_category_name(static_cast<MemCategory>(i));
    EXPECT_EQ(col(g + "/predicted_bytes"), (std::vector<int64_t>{1000 + i, 1000 + i}));
    EXPECT_EQ(col(g + "/current_bytes"), (std::vector<int64_t>{2000 + i, 2000 + i}));
    EXPECT_EQ(col(g + "/peak_bytes"), (std::vector<int64_t>{3000 + i, i == 0 ? 7 : 3000 + i}));
  }
  EXPECT_EQ(col("/memory/process/rss_bytes"), (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(col("/memory/process/rss_peak_bytes"), (std::vector<int64_t>{20, 21}));
  EXPECT_EQ(col("/memory/process/pss_bytes"), (std::vector<int64_t>{30, 31}));

  EXPECT_EQ(read_scalar<double>(f, "/timing/forward/seconds", H5T_NATIVE_DOUBLE), 1.5);
  EXPECT_EQ(read_scalar<double>(f, "/timing/backward/seconds", H5T_NATIVE_DOUBLE), 2.5);
  EXPECT_EQ(read_scalar<double>(f, "/timing/other/seconds", H5T_NATIVE_DOUBLE), 0.0);
  H5Fclose(f);
}

// A node's predicted memory is the largest phase of its ranks' sums, not the
// sum of each rank's largest phase: two ranks that peak in different phases
// do not peak together. `shared` (pages another rank holds) never counts.
TEST_F(RunLogTest, NodePeaksSumEachPhaseOverTheNodesRanks) {
  auto rank = [](int node, size_t runtime_pss, std::array<size_t, kNumMemPhases> phases) {
    ProcessPrediction p;
    p.node = node;
    p.runtime_pss = runtime_pss;
    p.runtime = 1000 * runtime_pss;  // RSS-based: not the node's figure
    p.phases = phases;
    p.shared = 777;
    return p;
  };
  static_assert(kNumMemPhases == 4);
  // Node 0: rank 0 peaks at base loading (100), rank 1 in training (90):
  // per phase 10+20 = 30, 10+100+20+5 = 135, 10+40+20+60 = 130, 10+50+20+90
  // = 170 -> 170 (the ranks' own peaks would add to 10+100+20+90 = 220).
  // Node 1: one rank, 3 + 8 = 11 at start-up.
  const std::vector<ProcessPrediction> ranks = {
      rank(0, 10, {0, 100, 40, 50}), rank(0, 20, {0, 5, 60, 90}), rank(1, 3, {8, 0, 2, 1})};
  EXPECT_EQ(predicted_node_peaks(ranks), (std::vector<size_t>{170, 11}));
  EXPECT_TRUE(predicted_node_peaks({}).empty());

  const std::string dir = (dir_ / "node").string();
  {
    RunLog log(dir, "");
    log.write_node_prediction({10, 20, 3}, {0, 0, 1}, {170, 11}, {160, 12});
  }
  hid_t f = H5Fopen((fs::path(dir) / "run.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  auto col = [&](const char* name) { return read_column<int64_t>(f, name, H5T_NATIVE_INT64); };
  EXPECT_EQ(col("/memory/process/runtime_pss_bytes"), (std::vector<int64_t>{10, 20, 3}));
  EXPECT_EQ(col("/memory/process/node"), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(col("/memory/node/predicted_peak_bytes"), (std::vector<int64_t>{170, 11}));
  EXPECT_EQ(col("/memory/node/pss_bytes"), (std::vector<int64_t>{160, 12}));
  H5Fclose(f);
}

TEST_F(RunLogTest, ReplacesAnOldLog) {
  std::string dir = dir_.string();
  {
    RunLog old(dir, "old");
    old.append(1, 1, 1, 1, 1);
    old.append(2, 1, 1, 1, 1);
  }
  // Without output.overwrite the old log stays, whole.
  try {
    RunLog again(dir, "again");
    ADD_FAILURE() << "no error";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("output.overwrite = true"), std::string::npos) << e.what();
  }
  {
    h5::File f = h5::open_file((dir_ / "run.h5").string());
    EXPECT_EQ(h5::read_string_attr(f, "config"), "old");
    EXPECT_EQ(h5::read_dataset<int64_t>(f, "metrics/step").size(), 2u);
  }
  { RunLog fresh(dir, "new", /*overwrite=*/true); }
  h5::File f = h5::open_file((dir_ / "run.h5").string());
  EXPECT_EQ(h5::read_string_attr(f, "config"), "new");
  EXPECT_TRUE(h5::read_dataset<int64_t>(f, "metrics/step").empty());
}

// A resumed run's log starts with the earlier log's rows up to the
// checkpoint's step (those after it are trained again), and lists every
// step resumed at; with no earlier log, or one that cannot be read, it
// starts empty.
TEST_F(RunLogTest, AResumedRunCarriesTheEarlierRowsUpToItsCheckpoint) {
  const std::string dir = dir_.string();
  const fs::path path = dir_ / "run.h5";
  {
    RunLog first(dir, "first");
    for (int64_t s = 1; s <= 7; ++s) first.append(s, 10.0 - s, 0.1 * s, 2.0 * s, 100.0 * s);
  }
  auto column = [&](const char* name) {
    h5::File f = h5::open_file(path.string());
    return h5::read_dataset<double>(f, name);
  };
  {
    RunLog second(dir, "second", true, /*resumed_at=*/4);
    EXPECT_EQ(second.carried_rows(), 4);
    EXPECT_EQ(second.rows(), 4);
    second.append(5, 0.5, 0.5, 0.5, 0.5);
  }
  {
    h5::File f = h5::open_file(path.string());
    EXPECT_EQ(h5::read_dataset<int64_t>(f, "metrics/step"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
    EXPECT_EQ(h5::read_dataset<int64_t>(f, "resumed_at_steps"), (std::vector<int64_t>{4}));
    EXPECT_EQ(h5::read_string_attr(f, "config"), "second");
  }
  EXPECT_EQ(column("metrics/loss"), (std::vector<double>{9, 8, 7, 6, 0.5}));
  EXPECT_EQ(column("metrics/lr"), (std::vector<double>{0.1, 0.2, 0.1 * 3, 0.4, 0.5}));
  EXPECT_EQ(column("metrics/grad_norm"), (std::vector<double>{2, 4, 6, 8, 0.5}));
  EXPECT_EQ(column("metrics/tokens_per_s"), (std::vector<double>{100, 200, 300, 400, 0.5}));
  {
    // Resumed again, from step 2: the list grows.
    RunLog third(dir, "third", true, 2);
    EXPECT_EQ(third.carried_rows(), 2);
  }
  {
    h5::File f = h5::open_file(path.string());
    EXPECT_EQ(h5::read_dataset<int64_t>(f, "metrics/step"), (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(h5::read_dataset<int64_t>(f, "resumed_at_steps"), (std::vector<int64_t>{4, 2}));
  }
  // An earlier log without its metrics (damaged): a warning, an empty log.
  {
    h5::File f = h5::create_file(path.string());
    h5::write_scalar_attr<int32_t>(f, "format_version", kRunLogFormatVersion);
    h5::write_string_attr(f, "config", "x");
  }
  {
    RunLog fourth(dir, "fourth", true, 6);
    EXPECT_EQ(fourth.carried_rows(), 0);
  }
  {
    h5::File f = h5::open_file(path.string());
    EXPECT_TRUE(h5::read_dataset<int64_t>(f, "metrics/step").empty());
    EXPECT_EQ(h5::read_dataset<int64_t>(f, "resumed_at_steps"), (std::vector<int64_t>{6}));
  }
  // No earlier log at all.
  fs::remove(path);
  {
    RunLog fifth(dir, "fifth", true, 3);
    EXPECT_EQ(fifth.carried_rows(), 0);
  }
}

// Evaluations (train.eval_every) have their own rows, metrics/val_step and
// val_loss, flushed one at a time; a resumed run carries those up to its
// checkpoint's step like the other metrics, and a log written before
// evaluations existed (no val columns) is carried with none.
TEST_F(RunLogTest, ValidationRowsAndTheirCarryOnResume) {
  const std::string dir = dir_.string();
  const fs::path path = dir_ / "run.h5";
  auto read = [&](auto& steps, auto& losses) {
    h5::File f = h5::open_file(path.string());
    steps = h5::read_dataset<int64_t>(f, "metrics/val_step");
    losses = h5::read_dataset<double>(f, "metrics/val_loss");
  };
  std::vector<int64_t> steps;
  std::vector<double> losses;
  {
    RunLog first(dir, "first");
    for (int64_t s = 1; s <= 9; ++s) {
      first.append(s, 10.0 - s, 0.1, 1.0, 100.0);
      if (s % 3 == 0) first.append_val(s, 20.0 - s);
    }
    EXPECT_EQ(first.val_rows(), 3);
    EXPECT_EQ(first.rows(), 9);
    read(steps, losses);  // on disk before the log is closed
    EXPECT_EQ(steps, (std::vector<int64_t>{3, 6, 9}));
    EXPECT_EQ(losses, (std::vector<double>{17, 14, 11}));
  }
  {
    RunLog second(dir, "second", true, /*resumed_at=*/6);
    EXPECT_EQ(second.val_rows(), 2);
    second.append_val(9, 1.5);
  }
  read(steps, losses);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 6, 9}));
  EXPECT_EQ(losses, (std::vector<double>{17, 14, 1.5}));
  {
    RunLog third(dir, "third", true, 5);
    EXPECT_EQ(third.val_rows(), 1);
    EXPECT_EQ(third.carried_rows(), 5);
  }
  read(steps, losses);
  EXPECT_EQ(steps, (std::vector<int64_t>{3}));
  // An earlier log of a meshlm without evaluations: its metrics, no val rows.
  fs::remove(path);
  {
    h5::File f = h5::create_file(path.string());
    h5::write_scalar_attr<int32_t>(f, "format_version", kRunLogFormatVersion);
    h5::write_string_attr(f, "config", "old");
    h5::write_dataset(f, "metrics/step", std::vector<int64_t>{1, 2});
    for (const char* c : {"loss", "lr", "grad_norm", "tokens_per_s"})
      h5::write_dataset(f, std::string("metrics/") + c, std::vector<double>{1, 2});
  }
  {
    RunLog fourth(dir, "fourth", true, 2);
    EXPECT_EQ(fourth.carried_rows(), 2);
    EXPECT_EQ(fourth.val_rows(), 0);
  }
  read(steps, losses);
  EXPECT_TRUE(steps.empty());
  EXPECT_TRUE(losses.empty());
}

// One run at a time per directory, and never over a run.h5 that is not a log.
TEST_F(RunLogTest, OneRunPerDirectoryAndOnlyOverItsOwnFiles) {
  const std::string dir = dir_.string();
  {
    RunLog first(dir, "first");
    try {
      RunLog second(dir, "second", /*overwrite=*/true);
      ADD_FAILURE() << "no error";
    } catch (const RankError& e) {
      EXPECT_NE(std::string(e.what()).find("in use by another meshlm run"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(check_output_dir(dir, true), RankError);
  }
  EXPECT_NO_THROW(check_output_dir(dir, true));  // the lock went with the first run
  const std::string other = (dir_ / "other").string();
  std::filesystem::create_directories(other);
  {
    h5::File f = h5::create_file(other + "/run.h5");
    h5::write_dataset<float>(f, "x", std::vector<float>{1});
  }
  EXPECT_THROW(RunLog(other, "x", /*overwrite=*/true), RankError);
  EXPECT_FALSE(is_run_log(other + "/run.h5"));
  EXPECT_TRUE(is_run_log(dir + "/run.h5"));
  const std::string file = (dir_ / "plain").string();
  std::fclose(std::fopen(file.c_str(), "w"));
  try {
    check_output_dir(file, true);
    ADD_FAILURE() << "no error";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a directory"), std::string::npos) << e.what();
  }
}

TEST_F(RunLogTest, RowsSurviveAKilledRun) {
  // The child logs two rows and dies without closing the file (no
  // destructors, no atexit handlers), as a run killed by the batch system.
  std::string dir = dir_.string();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto* log = new RunLog(dir, "killed");
    log->append(1, 2.0, 0.1, 0.5, 10.0);
    log->append(2, 1.5, 0.1, 0.5, 10.0);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  h5::File f = h5::open_file((dir_ / "run.h5").string());
  EXPECT_EQ(h5::read_dataset<int64_t>(f, "metrics/step"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(h5::read_dataset<double>(f, "metrics/loss"), (std::vector<double>{2.0, 1.5}));
}

TEST_F(RunLogTest, UncreatableDirectoryNamesIt) {
  std::string blocker = (dir_ / "file").string();
  std::fclose(std::fopen(blocker.c_str(), "w"));
  try {
    RunLog log(blocker + "/sub", "x");
    ADD_FAILURE() << "no error";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find(blocker + "/sub"), std::string::npos) << e.what();
  }
}

// The io/h5.h helpers the run log and other formats are built on.
TEST_F(RunLogTest, H5HelpersRoundTripAndTypeChecks) {
  const std::string path = (dir_ / "h.h5").string();
  {
    h5::File f = h5::create_file(path);
    std::vector<float> m = {1, 2, 3, 4, 5, 6};
    h5::write_dataset(f, "params/w", m.data(), {2, 3});  // parent group created
    h5::write_dataset(f, "ids", std::vector<uint16_t>{7, 8});
    h5::write_scalar<double>(f, "x", 1.0);
    h5::write_scalar<double>(f, "x", 2.0);  // overwrites
    h5::write_string_attr(f, "note", "hello");
    h5::write_scalar_attr<int32_t>(f, "n", 3);
    h5::write_scalar_attr<int32_t>(f, "n", 4);  // replaces
    h5::Group g = h5::require_group(f, "a/b");
    h5::write_string_attr(g, "empty", "");
    h5::close_file(f, path);
  }
  h5::File f = h5::open_file(path);
  std::vector<hsize_t> dims;
  EXPECT_EQ(h5::read_dataset<float>(f, "params/w", &dims), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(dims, (std::vector<hsize_t>{2, 3}));
  EXPECT_EQ(h5::read_dataset<double>(f, "params/w"), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(h5::read_dataset<int32_t>(f, "ids"), (std::vector<int32_t>{7, 8}));  // widening
  EXPECT_EQ(h5::read_dataset<double>(f, "x"), std::vector<double>{2.0});
  EXPECT_EQ(h5::read_string_attr(f, "note"), "hello");
  EXPECT_EQ(h5::read_scalar_attr<int64_t>(f, "n"), 4);
  h5::Group g = h5::require_group(f, "a/b");
  EXPECT_EQ(h5::read_string_attr(g, "empty"), "");
  EXPECT_TRUE(h5::exists(f, "/a/b"));
  EXPECT_FALSE(h5::exists(f, "no/such/path"));
  for (auto bad : std::vector<std::function<void()>>{
           [&] { h5::read_dataset<int32_t>(f, "params/w"); },  // float -> int
           [&] { h5::read_dataset<uint8_t>(f, "ids"); },       // narrowing
           [&] { h5::read_dataset<float>(f, "missing"); },
           [&] { h5::read_scalar_attr<int32_t>(f, "note"); },  // string -> int
           [&] { h5::read_string_attr(f, "n"); }}) {
    try {
      bad();
      ADD_FAILURE() << "no error";
    } catch (const RankError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(h5::open_file((dir_ / "missing.h5").string()), RankError);
}

// Fixed-length string attributes as other writers make them (h5py's
// np.bytes_, Fortran codes): NUL-padded without a terminator, or
// NUL-terminated with room to spare. The whole text comes back.
TEST_F(RunLogTest, FixedLengthStringAttributesReadWhole) {
  const std::string path = (dir_ / "strings.h5").string();
  {
    h5::File f = h5::create_file(path);
    for (auto [name, pad, size] : {std::tuple{"nullpad", H5T_STR_NULLPAD, 5},
                                   std::tuple{"nullterm", H5T_STR_NULLTERM, 8},
                                   std::tuple{"spacepad", H5T_STR_SPACEPAD, 5}}) {
      h5::Datatype t(H5Tcopy(H5T_C_S1));
      H5Tset_size(t, size);
      H5Tset_strpad(t, pad);
      h5::Dataspace s(H5Screate(H5S_SCALAR));
      hid_t a = H5Acreate2(f, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
      ASSERT_GE(a, 0);
      char buf[8] = {'h', 'e', 'l', 'l', 'o', 0, 0, 0};
      ASSERT_GE(H5Awrite(a, t, buf), 0);
      H5Aclose(a);
    }
  }
  h5::File f = h5::open_file(path);
  EXPECT_EQ(h5::read_string_attr(f, "nullpad"), "hello");
  EXPECT_EQ(h5::read_string_attr(f, "nullterm"), "hello");
  EXPECT_EQ(h5::read_string_attr(f, "spacepad"), "hello");
}

// A run log that cannot be written whole at the start (a full disk, here a
// file-size limit) leaves nothing behind, rather than an unreadable run.h5.
TEST_F(RunLogTest, NoHalfWrittenLogWhenTheDiskIsFull) {
  const std::string dir = dir_.string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // writes past the limit fail with EFBIG instead
    struct rlimit lim {512, 512};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      RunLog log(dir, std::string(4096, 'c'));
      ::_exit(1);  // created although it cannot fit
    } catch (const RankError&) {
      ::_exit(0);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the run log was created past the file-size limit";
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run.h5"));
}
