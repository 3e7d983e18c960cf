// Communicator over MPI_COMM_WORLD (and three duplicates of it: the two steps of ordered sums, and
// the watchdog's roll calls). ordered_sum is a reduce-scatter made of an alltoall of shards
// and a local sum in rank order, then an allgather: an allreduce whose result does not depend on
// MPI's algorithm or transport. Both steps are nonblocking collectives, advanced by MPI_Test from
// the thread that started them (the main thread: MPI_THREAD_FUNNELED suffices). A blocked rank waits
// with a deadline (peer_timeout_from_environment): a rank cut off from the others (its host's link
// down) would otherwise leave every rank waiting for as long as TCP retries.
#include "distributed/mpi_communicator.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <stdexcept>

namespace tapegrad::distributed {

namespace {

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(fmt::format("{} failed: {}", call, std::string(text, std::size_t(length))));
}

int to_int(std::size_t count, const char* what) {
  if (count > std::size_t(std::numeric_limits<int>::max()))
    throw std::invalid_argument(fmt::format("{}: {} elements exceed MPI's int counts; use smaller buckets", what, count));
  return int(count);
}

using Clock = std::chrono::steady_clock;

/// Waits for one nonblocking collective for at most `timeout` (none when zero). Past it, a roll
/// call on `health` (a communicator of its own): every rank that is waiting too answers at once, so
/// the ranks that do not answer within 2 s are the lost ones (or busy outside a collective for that
/// long), and every rank that can still talk names them before the job ends. A rank answers roll
/// calls while it waits here.
class Watchdog {
 public:
  Watchdog(MPI_Comm health, int rank, int size, std::chrono::milliseconds timeout)
      : health_(health), rank_(rank), size_(size), timeout_(timeout) {}

  void wait(MPI_Request& request, const char* what) {
    const Clock::time_point start = Clock::now();
    Clock::time_point next_look = start;
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      const Clock::time_point now = Clock::now();
      if (now < next_look) continue;
      next_look = now + std::chrono::milliseconds(1);
      answer_roll_calls();
      if (timeout_.count() > 0 && now - start > timeout_) lost(what);
    }
  }

 private:
  static constexpr int kCall = 1, kAnswer = 2;

  void answer_roll_calls() {
    for (;;) {
      int waiting = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kCall, health_, &waiting, &status);
      if (!waiting) return;
      int call = 0;
      MPI_Recv(&call, 1, MPI_INT, status.MPI_SOURCE, kCall, health_, MPI_STATUS_IGNORE);
      MPI_Request answer;  // a small message: sent eagerly, nothing to wait for
      MPI_Isend(&answer_, 1, MPI_INT, status.MPI_SOURCE, kAnswer, health_, &answer);
      MPI_Request_free(&answer);
    }
  }

  [[noreturn]] void lost(const char* what) {
    const auto grace = std::chrono::milliseconds(2000);
    std::vector<int> answers(std::size_t(size_), 0);
    std::vector<MPI_Request> receives(std::size_t(size_), MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Irecv(&answers[std::size_t(r)], 1, MPI_INT, r, kAnswer, health_, &receives[std::size_t(r)]);
      MPI_Request call;  // a lost rank never takes it; the job ends before that matters
      MPI_Isend(&call_, 1, MPI_INT, r, kCall, health_, &call);
      MPI_Request_free(&call);
    }
    const Clock::time_point until = Clock::now() + grace;
    std::vector<int> silent;
    while (Clock::now() < until) {
      answer_roll_calls();
      silent.clear();
      for (int r = 0; r < size_; ++r) {
        int done = 1;
        if (receives[std::size_t(r)] != MPI_REQUEST_NULL) MPI_Test(&receives[std::size_t(r)], &done, MPI_STATUS_IGNORE);
        if (!done) silent.push_back(r);
      }
      if (silent.empty()) break;
    }
    std::string names;
    for (int r : silent) names += fmt::format("{}{}", names.empty() ? "" : ", ", r);
    const double waited = double(timeout_.count()) / 1e3;
    const std::string message =
        silent.empty()
            ? fmt::format("rank {}: {} waited {:g} s, yet every rank answered a roll call: a rank is slower than "
                          "TAPEGRAD_PEER_TIMEOUT={:g} allows (raise it) or stuck; ending the job\n",
                          rank_, what, waited, waited)
            : fmt::format("rank {}: {} waited {:g} s; lost rank{} {} (no answer to a roll call within {:g} s: its "
                          "host, its link or the process is down, or it was busy outside a collective that long); "
                          "ending the job\n",
                          rank_, what, waited, silent.size() > 1 ? "s" : "", names, double(grace.count()) / 1e3);
    std::fputs(message.c_str(), stderr);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  MPI_Comm health_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  int call_ = 0, answer_ = 0;  // the payloads: they must outlive the sends
};

/// The communicators of ordered sums in progress: one for their first steps, one for their second
/// steps. MPI needs every rank to start the collectives of a communicator in the same order; the
/// sums start in the same order everywhere, but when each one's second step starts depends on
/// timing (after its first is done), so each step has its own communicator.
struct SumCommunicators {
  MPI_Comm shards = MPI_COMM_NULL, gather = MPI_COMM_NULL;
};

/// The ordered sum of one buffer in two nonblocking steps: MPI_Ialltoallv sends shard j of the
/// buffer to rank j; once it is done, the local sum of my shard in rank order; then
/// MPI_Iallgatherv shares every rank's summed shard. test() moves from one step to the next.
/// Sums must be advanced in the order they started (each starts its gather when its first step
/// is done, and every rank must start the gathers in one order): callers test or wait for the
/// earliest unfinished sum first.
class OrderedSum final : public PendingSum {
 public:
  OrderedSum(std::span<float> buffer, int rank, int size, SumCommunicators comms, Watchdog& watchdog)
      : buffer_(buffer), rank_(std::size_t(rank)), comms_(comms), watchdog_(watchdog) {
    const std::size_t n = buffer.size(), ranks = std::size_t(size);
    if (ranks == 1) return;
    counts_.resize(ranks), offsets_.resize(ranks);
    for (std::size_t j = 0, offset = 0; j < ranks; ++j) {
      const std::size_t count = n / ranks + (j < n % ranks ? 1 : 0);
      counts_[j] = to_int(count, "ordered_sum");
      offsets_[j] = to_int(offset, "ordered_sum");
      offset += count;
    }
    const std::size_t mine = std::size_t(counts_[rank_]);
    shards_.resize(mine * ranks);  // (ranks, mine): row r is rank r's copy of my shard
    receive_counts_.assign(ranks, int(mine));
    receive_offsets_.resize(ranks);
    for (std::size_t r = 0; r < ranks; ++r) receive_offsets_[r] = to_int(r * mine, "ordered_sum");
    check(MPI_Ialltoallv(buffer.data(), counts_.data(), offsets_.data(), MPI_FLOAT, shards_.data(),
                         receive_counts_.data(), receive_offsets_.data(), MPI_FLOAT, comms_.shards, &request_),
          "MPI_Ialltoallv");
    step_ = Step::shards;
  }
  // MPI still reads and writes the buffers of an unfinished sum (say, backward threw on this rank
  // while sums were in flight): freeing them under it is not an option, so the job ends.
  ~OrderedSum() override {
    if (step_ == Step::done) return;
    std::fputs("ordered_sum: a gradient exchange was abandoned before it finished; ending the job\n", stderr);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  bool test() override {
    while (step_ != Step::done) {
      int done = 0;
      check(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) return false;
      advance();
    }
    return true;
  }
  void wait() override {
    while (step_ != Step::done) {
      watchdog_.wait(request_, step_ == Step::shards ? "the gradient exchange (MPI_Ialltoallv)"
                                                : "the gradient exchange (MPI_Iallgatherv)");
      advance();
    }
  }

 private:
  enum class Step { shards, gather, done };
  // The current step's request is complete: sum my shard and start the gather, or finish.
  void advance() {
    if (step_ == Step::gather) {
      step_ = Step::done;
      return;
    }
    const std::size_t mine = std::size_t(counts_[rank_]), ranks = counts_.size();
    float* sum = buffer_.data() + offsets_[rank_];
    std::copy_n(shards_.data(), mine, sum);
    for (std::size_t r = 1; r < ranks; ++r) {  // rank order: ((s0 + s1) + s2) + ...
      const float* shard = shards_.data() + r * mine;
      for (std::size_t i = 0; i < mine; ++i) sum[i] += shard[i];
    }
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer_.data(), counts_.data(), offsets_.data(),
                          MPI_FLOAT, comms_.gather, &request_),
          "MPI_Iallgatherv");
    step_ = Step::gather;
  }

  std::span<float> buffer_;
  std::size_t rank_;
  SumCommunicators comms_;
  Watchdog& watchdog_;
  std::vector<int> counts_, offsets_, receive_counts_, receive_offsets_;
  std::vector<float> shards_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  Step step_ = Step::done;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int& argc, char**& argv) {
    const std::chrono::milliseconds timeout = peer_timeout_from_environment();  // refused before MPI starts
    int provided = 0;
    check(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    check(MPI_Comm_dup(MPI_COMM_WORLD, &sums_.shards), "MPI_Comm_dup");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &sums_.gather), "MPI_Comm_dup");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &health_), "MPI_Comm_dup");
    watchdog_.emplace(health_, rank_, size_, timeout);
  }
  ~MpiCommunicator() override {
    MPI_Comm_free(&sums_.shards);
    MPI_Comm_free(&sums_.gather);
    MPI_Comm_free(&health_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string description() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string text(version, std::size_t(length));
    text = text.substr(0, text.find_first_of(",\n"));
    return fmt::format("MPI ({}), {} ranks", text, size_);
  }

  std::unique_ptr<PendingSum> start_ordered_sum(std::span<float> buffer) override {
    return std::make_unique<OrderedSum>(buffer, rank_, size_, sums_, *watchdog_);
  }

  void broadcast(std::span<std::byte> bytes, int root) override {
    // In pieces below 2^31 bytes (MPI counts are int).
    constexpr std::size_t piece = std::size_t(1) << 30;
    for (std::size_t at = 0; at < bytes.size(); at += piece) {
      const std::size_t count = std::min(piece, bytes.size() - at);
      MPI_Request request;
      check(MPI_Ibcast(bytes.data() + at, int(count), MPI_BYTE, root, MPI_COMM_WORLD, &request), "MPI_Ibcast");
      watchdog_->wait(request, "a broadcast (MPI_Ibcast)");
    }
  }

  std::vector<std::byte> allgather(std::span<const std::byte> mine) override {
    std::vector<std::byte> all(mine.size() * std::size_t(size_));
    const int count = to_int(mine.size(), "allgather");
    MPI_Request request;
    check(MPI_Iallgather(mine.data(), count, MPI_BYTE, all.data(), count, MPI_BYTE, MPI_COMM_WORLD, &request),
          "MPI_Iallgather");
    watchdog_->wait(request, "an allgather (MPI_Iallgather)");
    return all;
  }

  void barrier() override {
    MPI_Request request;
    check(MPI_Ibarrier(MPI_COMM_WORLD, &request), "MPI_Ibarrier");
    watchdog_->wait(request, "a barrier (MPI_Ibarrier)");
  }

  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);
  }

 private:
  int rank_ = 0, size_ = 1;
  SumCommunicators sums_;
  MPI_Comm health_ = MPI_COMM_NULL;  // the watchdog's roll calls, apart from the collectives
  std::optional<Watchdog> watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(int& argc, char**& argv) {
  return std::make_unique<MpiCommunicator>(argc, argv);
}

}  // namespace tapegrad::distributed
