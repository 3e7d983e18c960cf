// Communicator over MPI_COMM_WORLD. ordered_sum is a reduce-scatter made of an alltoall of shards
// and a local sum in rank order, then an allgather: an allreduce whose result does not depend on
// MPI's algorithm or transport.
#include "distributed/mpi_communicator.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
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

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int& argc, char**& argv) {
    int provided = 0;
    check(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCommunicator() override { MPI_Finalize(); }

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

  void ordered_sum(std::span<float> buffer) override {
    if (size_ == 1) return;
    const std::size_t n = buffer.size(), ranks = std::size_t(size_);
    // Shard j of every rank's buffer goes to rank j: counts[j] elements at offsets[j].
    std::vector<int> counts(ranks), offsets(ranks);
    for (std::size_t j = 0, offset = 0; j < ranks; ++j) {
      const std::size_t count = n / ranks + (j < n % ranks ? 1 : 0);
      counts[j] = to_int(count, "ordered_sum");
      offsets[j] = to_int(offset, "ordered_sum");
      offset += count;
    }
    const std::size_t mine = std::size_t(counts[std::size_t(rank_)]);
    shards_.resize(mine * ranks);  // (ranks, mine): row r is rank r's copy of my shard
    std::vector<int> receive_counts(ranks, int(mine)), receive_offsets(ranks);
    for (std::size_t r = 0; r < ranks; ++r) receive_offsets[r] = to_int(r * mine, "ordered_sum");
    check(MPI_Alltoallv(buffer.data(), counts.data(), offsets.data(), MPI_FLOAT, shards_.data(), receive_counts.data(),
                        receive_offsets.data(), MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Alltoallv");
    float* sum = buffer.data() + offsets[std::size_t(rank_)];
    std::copy_n(shards_.data(), mine, sum);
    for (std::size_t r = 1; r < ranks; ++r) {  // rank order: ((s0 + s1) + s2) + ...
      const float* shard = shards_.data() + r * mine;
      for (std::size_t i = 0; i < mine; ++i) sum[i] += shard[i];
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data(), counts.data(), offsets.data(), MPI_FLOAT,
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }

  void broadcast(std::span<std::byte> bytes, int root) override {
    // In pieces below 2^31 bytes (MPI counts are int).
    constexpr std::size_t piece = std::size_t(1) << 30;
    for (std::size_t at = 0; at < bytes.size(); at += piece) {
      const std::size_t count = std::min(piece, bytes.size() - at);
      check(MPI_Bcast(bytes.data() + at, int(count), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

  std::vector<std::byte> allgather(std::span<const std::byte> mine) override {
    std::vector<std::byte> all(mine.size() * std::size_t(size_));
    const int count = to_int(mine.size(), "allgather");
    check(MPI_Allgather(mine.data(), count, MPI_BYTE, all.data(), count, MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather");
    return all;
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);
  }

 private:
  int rank_ = 0, size_ = 1;
  std::vector<float> shards_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(int& argc, char**& argv) {
  return std::make_unique<MpiCommunicator>(argc, argv);
}

}  // namespace tapegrad::distributed
