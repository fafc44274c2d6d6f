// Pipeline schedules (plan/pipeline_schedule.h): the action lists of every
// stage for p = 1..8 stages and m = 1..16 micro-batches, and a discrete-event
// simulation of all stages together that shows they never deadlock and idle
// exactly the bubble the formula predicts.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/pipeline_schedule.h"

using namespace meshlm;

namespace {

constexpr PipelineSchedule kKinds[] = {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b};
constexpr int kMaxStages = 8, kMaxMicro = 16;

bool valid(PipelineSchedule kind, int p, int m) {
  return kind == PipelineSchedule::gpipe || m >= p;
}

// The forwards and backwards only, as "F0 F1 B0 ...".
std::string compute_order(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) {
    if (a.kind != ActionKind::forward && a.kind != ActionKind::backward) continue;
    if (!s.empty()) s += ' ';
    s += (a.kind == ActionKind::forward ? "F" : "B") + std::to_string(a.micro);
  }
  return s;
}

std::string error_of(PipelineSchedule kind, int stage, int p, int m) {
  try {
    build_schedule(kind, stage, p, m);
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "";
}

// Runs the lists of all stages together. Sends are buffered and return at
// once; a recv waits until the neighbour has sent the same micro-batch;
// forward and backward take one time unit, communication none. Each stage
// runs its list in order, as early as its receives allow.
struct SimResult {
  bool deadlock = false;
  int makespan = 0;
  std::vector<int> busy;  // [p] time units of forward + backward
  std::vector<int> end;   // [p] time the stage ran its last action
};

SimResult simulate(const std::vector<std::vector<Action>>& lists, int m) {
  const int p = static_cast<int>(lists.size());
  // Time at which stage s sent micro-batch i forward / backward; -1: not yet.
  std::vector<std::vector<int>> sent_fwd(p, std::vector<int>(m, -1));
  std::vector<std::vector<int>> sent_bwd(p, std::vector<int>(m, -1));
  std::vector<size_t> pc(p, 0);
  SimResult r;
  r.busy.assign(p, 0);
  r.end.assign(p, 0);
  std::vector<int>& clock = r.end;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (pc[s] < lists[s].size()) {
        const Action& a = lists[s][pc[s]];
        int ready = clock[s];
        if (a.kind == ActionKind::recv_forward) ready = s > 0 ? sent_fwd[s - 1][a.micro] : -1;
        if (a.kind == ActionKind::recv_backward) ready = s < p - 1 ? sent_bwd[s + 1][a.micro] : -1;
        if (ready < 0) break;  // blocked on a message not sent yet
        clock[s] = std::max(clock[s], ready);
        if (a.kind == ActionKind::forward || a.kind == ActionKind::backward) {
          clock[s] += 1;
          r.busy[s] += 1;
        }
        if (a.kind == ActionKind::send_forward) sent_fwd[s][a.micro] = clock[s];
        if (a.kind == ActionKind::send_backward) sent_bwd[s][a.micro] = clock[s];
        ++pc[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) r.deadlock = r.deadlock || pc[s] != lists[s].size();
  r.makespan = *std::max_element(r.end.begin(), r.end.end());
  return r;
}

std::vector<std::vector<Action>> all_stages(PipelineSchedule kind, int p, int m) {
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < p; ++s) lists.push_back(build_schedule(kind, s, p, m));
  return lists;
}

// The micro-batches of one kind of action, in list order.
std::vector<int> micros_of(const std::vector<Action>& actions, ActionKind kind) {
  std::vector<int> out;
  for (const Action& a : actions)
    if (a.kind == kind) out.push_back(a.micro);
  return out;
}

}  // namespace

TEST(PipelineSchedule, NamesRoundTrip) {
  EXPECT_EQ(enum_from_name<PipelineSchedule>("gpipe"), PipelineSchedule::gpipe);
  EXPECT_EQ(enum_from_name<PipelineSchedule>("1f1b"), PipelineSchedule::one_f_one_b);
  for (PipelineSchedule k : kKinds) EXPECT_EQ(enum_from_name<PipelineSchedule>(name_of(k)), k);
  for (const char* bad : {"", "GPipe", "1F1B", "interleaved", "1f1b "})
    EXPECT_FALSE(enum_from_name<PipelineSchedule>(bad).has_value()) << bad;
  EXPECT_EQ(enum_choices<PipelineSchedule>(), "gpipe | 1f1b");
}

// The planner's slot count is the formula; the schedules' own lists must
// keep exactly that many micro-batches in flight.
TEST(PipelineSchedule, InFlightMatchesThePlannersFormula) {
  for (PipelineSchedule k : kKinds)
    for (int p = 1; p <= 6; ++p)
      for (int m = (k == PipelineSchedule::one_f_one_b ? p : 1); m <= 9; ++m)
        for (int s = 0; s < p; ++s)
          EXPECT_EQ(max_in_flight(build_schedule(k, s, p, m)), in_flight_micro_batches(k, s, p, m))
              << name_of(k) << " p=" << p << " m=" << m << " s=" << s;
}

TEST(PipelineSchedule, ActionNamesAreDistinct) {
  const ActionKind kinds[] = {ActionKind::recv_forward,  ActionKind::forward,
                              ActionKind::send_forward,  ActionKind::recv_backward,
                              ActionKind::backward,      ActionKind::send_backward};
  std::vector<std::string> names;
  for (ActionKind k : kinds) names.push_back(action_name(k));
  EXPECT_EQ(names[0], "recv_forward");
  EXPECT_EQ(names[5], "send_backward");
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());
}

// Every micro-batch once forward and once backward, forward first, each
// wrapped in the receives and sends its position in the pipe calls for.
TEST(PipelineSchedule, EveryStageHasWellFormedActions) {
  for (PipelineSchedule kind : kKinds)
    for (int p = 1; p <= kMaxStages; ++p)
      for (int m = 1; m <= kMaxMicro; ++m) {
        if (!valid(kind, p, m)) continue;
        for (int s = 0; s < p; ++s) {
          SCOPED_TRACE(std::string(name_of(kind)) + " p=" + std::to_string(p) +
                       " m=" + std::to_string(m) + " stage=" + std::to_string(s));
          const std::vector<Action> a = build_schedule(kind, s, p, m);
          const bool first = s == 0, last = s == p - 1;
          EXPECT_EQ(a.size(), size_t(2 * m + (first ? 0 : 2 * m) + (last ? 0 : 2 * m)));
          std::vector<int> fwd_at(m, -1), bwd_at(m, -1);
          for (size_t j = 0; j < a.size(); ++j) {
            ASSERT_GE(a[j].micro, 0);
            ASSERT_LT(a[j].micro, m);
            if (a[j].kind == ActionKind::forward) {
              EXPECT_EQ(fwd_at[a[j].micro], -1) << "second forward";
              fwd_at[a[j].micro] = static_cast<int>(j);
            }
            if (a[j].kind == ActionKind::backward) {
              EXPECT_EQ(bwd_at[a[j].micro], -1) << "second backward";
              bwd_at[a[j].micro] = static_cast<int>(j);
            }
          }
          for (int i = 0; i < m; ++i) {
            const int f = fwd_at[i], b = bwd_at[i];
            ASSERT_GE(f, 0) << "no forward " << i;
            ASSERT_GE(b, 0) << "no backward " << i;
            EXPECT_LT(f, b);
            if (!first) {
              EXPECT_EQ(a[f - 1], (Action{ActionKind::recv_forward, i}));
              EXPECT_EQ(a[b + 1], (Action{ActionKind::send_backward, i}));
            }
            if (!last) {
              EXPECT_EQ(a[f + 1], (Action{ActionKind::send_forward, i}));
              EXPECT_EQ(a[b - 1], (Action{ActionKind::recv_backward, i}));
            }
          }
          // With the size check, these counts leave no stray communication.
          EXPECT_EQ(micros_of(a, ActionKind::recv_forward).size(), size_t(first ? 0 : m));
          EXPECT_EQ(micros_of(a, ActionKind::send_backward).size(), size_t(first ? 0 : m));
          EXPECT_EQ(micros_of(a, ActionKind::send_forward).size(), size_t(last ? 0 : m));
          EXPECT_EQ(micros_of(a, ActionKind::recv_backward).size(), size_t(last ? 0 : m));
        }
      }
}

TEST(PipelineSchedule, GPipeRunsAllForwardsThenAllBackwards) {
  for (int p = 1; p <= kMaxStages; ++p)
    for (int m = 1; m <= kMaxMicro; ++m) {
      std::string want;
      for (int i = 0; i < m; ++i) want += (i ? " F" : "F") + std::to_string(i);
      for (int i = 0; i < m; ++i) want += " B" + std::to_string(i);
      for (int s = 0; s < p; ++s)
        EXPECT_EQ(compute_order(build_schedule(PipelineSchedule::gpipe, s, p, m)), want)
            << "p=" << p << " m=" << m << " stage=" << s;
    }
}

// p = 4, m = 6 written out in full, receives and sends included.
TEST(PipelineSchedule, OneFOneBWorkedExample) {
  using K = ActionKind;
  const std::vector<Action> stage0 = {
      {K::forward, 0}, {K::send_forward, 0},  // warm-up: p - s - 1 = 3 forwards
      {K::forward, 1}, {K::send_forward, 1},
      {K::forward, 2}, {K::send_forward, 2},
      {K::forward, 3}, {K::send_forward, 3}, {K::recv_backward, 0}, {K::backward, 0},  // steady
      {K::forward, 4}, {K::send_forward, 4}, {K::recv_backward, 1}, {K::backward, 1},
      {K::forward, 5}, {K::send_forward, 5}, {K::recv_backward, 2}, {K::backward, 2},
      {K::recv_backward, 3}, {K::backward, 3},  // cool-down
      {K::recv_backward, 4}, {K::backward, 4},
      {K::recv_backward, 5}, {K::backward, 5}};
  EXPECT_EQ(build_schedule(PipelineSchedule::one_f_one_b, 0, 4, 6), stage0);

  const std::vector<Action> stage3 = {
      {K::recv_forward, 0}, {K::forward, 0}, {K::backward, 0}, {K::send_backward, 0},
      {K::recv_forward, 1}, {K::forward, 1}, {K::backward, 1}, {K::send_backward, 1},
      {K::recv_forward, 2}, {K::forward, 2}, {K::backward, 2}, {K::send_backward, 2},
      {K::recv_forward, 3}, {K::forward, 3}, {K::backward, 3}, {K::send_backward, 3},
      {K::recv_forward, 4}, {K::forward, 4}, {K::backward, 4}, {K::send_backward, 4},
      {K::recv_forward, 5}, {K::forward, 5}, {K::backward, 5}, {K::send_backward, 5}};
  EXPECT_EQ(build_schedule(PipelineSchedule::one_f_one_b, 3, 4, 6), stage3);

  EXPECT_EQ(compute_order(build_schedule(PipelineSchedule::one_f_one_b, 1, 4, 6)),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(compute_order(build_schedule(PipelineSchedule::one_f_one_b, 2, 4, 6)),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
}

// The shape of 1F1B for every size: w = p - s - 1 forwards, m - w pairs of a
// forward and a backward, w backwards; micro-batches in increasing order.
TEST(PipelineSchedule, OneFOneBShape) {
  for (int p = 1; p <= kMaxStages; ++p)
    for (int m = p; m <= kMaxMicro; ++m)
      for (int s = 0; s < p; ++s) {
        const int w = p - s - 1;
        std::string want;
        int f = 0, b = 0;
        auto add = [&](const char* k, int& i) {
          want += (want.empty() ? "" : " ") + std::string(k) + std::to_string(i++);
        };
        for (int j = 0; j < w; ++j) add("F", f);
        for (int j = 0; j < m - w; ++j) {
          add("F", f);
          add("B", b);
        }
        for (int j = 0; j < w; ++j) add("B", b);
        EXPECT_EQ(compute_order(build_schedule(PipelineSchedule::one_f_one_b, s, p, m)), want)
            << "p=" << p << " m=" << m << " stage=" << s;
      }
}

TEST(PipelineSchedule, ActivationsInFlight) {
  for (int p = 1; p <= kMaxStages; ++p)
    for (int m = 1; m <= kMaxMicro; ++m)
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(max_in_flight(build_schedule(PipelineSchedule::gpipe, s, p, m)), m);
        if (m < p) continue;
        const int live = max_in_flight(build_schedule(PipelineSchedule::one_f_one_b, s, p, m));
        EXPECT_EQ(live, std::min(p - s, m)) << "p=" << p << " m=" << m << " stage=" << s;
        EXPECT_LE(live, p - s);  // the bound 1F1B exists for, whatever m is
      }
  EXPECT_EQ(max_in_flight({}), 0);
}

TEST(PipelineSchedule, BubbleFormula) {
  EXPECT_DOUBLE_EQ(bubble_fraction(1, 7), 0.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(8, 1), 7.0 / 8.0);
}

// The simulator itself: a stage that waits for a gradient before sending the
// activation that would produce it must be reported as a deadlock.
TEST(PipelineSchedule, SimulatorDetectsDeadlock) {
  std::vector<std::vector<Action>> lists = all_stages(PipelineSchedule::gpipe, 2, 2);
  ASSERT_FALSE(simulate(lists, 2).deadlock);
  auto& s0 = lists[0];
  const auto rb = std::find(s0.begin(), s0.end(), Action{ActionKind::recv_backward, 0});
  ASSERT_NE(rb, s0.end());
  std::rotate(s0.begin(), rb, rb + 1);  // recv_backward 0 first
  EXPECT_TRUE(simulate(lists, 2).deadlock);
}

// All stages together: no deadlock, the step takes 2 (m + p - 1) units, and
// every stage idles bubble_fraction(p, m) of it.
TEST(PipelineSchedule, SimulationMatchesBubble) {
  for (PipelineSchedule kind : kKinds)
    for (int p = 1; p <= kMaxStages; ++p)
      for (int m = 1; m <= kMaxMicro; ++m) {
        if (!valid(kind, p, m)) continue;
        SCOPED_TRACE(std::string(name_of(kind)) + " p=" + std::to_string(p) +
                     " m=" + std::to_string(m));
        const SimResult r = simulate(all_stages(kind, p, m), m);
        ASSERT_FALSE(r.deadlock);
        EXPECT_EQ(r.makespan, 2 * (m + p - 1));
        for (int s = 0; s < p; ++s) {
          EXPECT_EQ(r.busy[s], 2 * m);
          const double idle = static_cast<double>(r.makespan - r.busy[s]) / r.makespan;
          EXPECT_NEAR(idle, bubble_fraction(p, m), 1e-12) << "stage " << s;
        }
      }
}

// Each link carries its messages in the same order at both ends, so the
// trainer may match sends and receives by order (no tag per micro-batch).
TEST(PipelineSchedule, LinksKeepMessageOrder) {
  for (PipelineSchedule kind : kKinds)
    for (int p = 2; p <= kMaxStages; ++p)
      for (int m = 1; m <= kMaxMicro; ++m) {
        if (!valid(kind, p, m)) continue;
        const auto lists = all_stages(kind, p, m);
        for (int s = 0; s + 1 < p; ++s) {
          EXPECT_EQ(micros_of(lists[s], ActionKind::send_forward),
                    micros_of(lists[s + 1], ActionKind::recv_forward));
          EXPECT_EQ(micros_of(lists[s + 1], ActionKind::send_backward),
                    micros_of(lists[s], ActionKind::recv_backward));
        }
      }
}

// Evaluation's forward-only pass: every stage forwards every micro-batch in
// order, links match, and all stages together finish without deadlock in
// m + p - 1 time units (the pipe filled once).
TEST(PipelineSchedule, ForwardOnlyPass) {
  for (int p = 1; p <= kMaxStages; ++p)
    for (int m = 1; m <= kMaxMicro; ++m) {
      std::vector<std::vector<Action>> lists;
      for (int s = 0; s < p; ++s) lists.push_back(build_forward_schedule(s, p, m));
      std::vector<int> all(m);
      for (int i = 0; i < m; ++i) all[i] = i;
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(micros_of(lists[s], ActionKind::forward), all);
        EXPECT_TRUE(micros_of(lists[s], ActionKind::backward).empty());
        EXPECT_EQ(micros_of(lists[s], ActionKind::recv_forward),
                  s > 0 ? all : std::vector<int>{});
        if (s + 1 < p)
          EXPECT_EQ(micros_of(lists[s], ActionKind::send_forward),
                    micros_of(lists[s + 1], ActionKind::recv_forward));
      }
      const SimResult r = simulate(lists, m);
      ASSERT_FALSE(r.deadlock) << "p " << p << " m " << m;
      EXPECT_EQ(r.makespan, m + p - 1) << "p " << p << " m " << m;
    }
  EXPECT_THROW(build_forward_schedule(4, 4, 8), RankError);
  EXPECT_THROW(build_forward_schedule(0, 4, 0), RankError);
}

TEST(PipelineSchedule, Errors) {
  // 1F1B needs m >= p; GPipe takes any m >= 1.
  const std::string msg = error_of(PipelineSchedule::one_f_one_b, 0, 4, 3);
  for (const char* want : {"parallel.micro_batches = 3", "parallel.pp = 4", "parallel.schedule"})
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  for (int s = 0; s < 4; ++s) EXPECT_NE(error_of(PipelineSchedule::one_f_one_b, s, 4, 3), "");
  EXPECT_EQ(error_of(PipelineSchedule::gpipe, 0, 4, 3), "");
  EXPECT_EQ(error_of(PipelineSchedule::one_f_one_b, 0, 4, 4), "");

  for (PipelineSchedule kind : kKinds) {
    EXPECT_NE(error_of(kind, 0, 1, 0).find("parallel.micro_batches"), std::string::npos);
    EXPECT_NE(error_of(kind, 0, 0, 4).find("parallel.pp"), std::string::npos);
  }
  // A stage outside the pipe is a bug of the caller on this rank.
  EXPECT_THROW(build_schedule(PipelineSchedule::gpipe, 4, 4, 8), RankError);
  EXPECT_THROW(build_schedule(PipelineSchedule::gpipe, -1, 4, 8), RankError);
}
