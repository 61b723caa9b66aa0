// Parameter-server updates per second across processes, against a raw MPI server loop doing the
// same exchange in the same job. Run as `mpirun -np 4 bench_ps_updates` (1 server, 3 workers).
//
// One worker step is the exchange a training step makes:
//   - dense: pull a 4 MB f32 variable (a small request, a 4 MB reply), push a 4 MB gradient, which
//     the server applies (w -= lr g);
//   - sparse: pull 128 rows of a 100k x 64 f32 table (the ids out, the rows back), push 128 gradient
//     rows, which the server applies to those rows only.
// The raw loop is written here with MPI_Send / MPI_Recv: the server takes requests from any worker
// in arrival order and applies pushes with a plain loop, as a hand-written parameter server would.
// flowlet runs the same steps through ParameterServerStrategy (async mode, eager worker steps:
// Variable::value() / gather() pull, Worker::apply_gradients pushes, an SGD optimizer applies).
// Printed: updates/s of each and flowlet / raw (target >= 0.8). Every figure is the median of 5
// repetitions; within each repetition the two systems take turns, so a shared machine's load falls
// on both alike.
#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <flowlet/flowlet.hpp>
#include <numeric>
#include <vector>

namespace fl = flowlet;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRepetitions = 5;
constexpr int kServer = 0;
constexpr int kTagPull = 1, kTagReply = 2, kTagPush = 3, kTagDone = 4;
constexpr int64_t kDenseElements = int64_t{1} << 20;  // 4 MB of f32
constexpr int64_t kTableRows = 100'000, kTableCols = 64, kSparseIds = 128;
constexpr float kLearningRate = 1e-6f;

struct Shape {
  bool sparse = false;
  int64_t steps = 0;  // per worker per repetition
};

// Ids of step `step` of worker `worker`: kSparseIds distinct rows, spread over the table.
std::vector<int64_t> ids_of(int worker, int64_t step) {
  std::vector<int64_t> ids(kSparseIds);
  for (int64_t i = 0; i < kSparseIds; ++i) {
    ids[static_cast<size_t>(i)] = (i * 769 + step * 131 + worker * 17) % kTableRows;
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// The raw loop: returns seconds for `steps` steps of every worker (the slowest process's clock).
double raw_loop(const Shape& shape, int rank, int workers) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto begin = Clock::now();
  if (rank == kServer) {
    std::vector<float> w(static_cast<size_t>(shape.sparse ? kTableRows * kTableCols : kDenseElements), 0.5f);
    std::vector<float> buffer(w.size());
    std::vector<int64_t> ids(kSparseIds);
    int done = 0;
    while (done < workers) {
      MPI_Status status;
      MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &status);
      const int from = status.MPI_SOURCE;
      if (status.MPI_TAG == kTagDone) {
        MPI_Recv(nullptr, 0, MPI_BYTE, from, kTagDone, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        ++done;
      } else if (status.MPI_TAG == kTagPull) {
        int count = 0;
        MPI_Get_count(&status, MPI_INT64_T, &count);
        MPI_Recv(ids.data(), count, MPI_INT64_T, from, kTagPull, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (!shape.sparse) {
          MPI_Send(w.data(), static_cast<int>(w.size()), MPI_FLOAT, from, kTagReply, MPI_COMM_WORLD);
        } else {
          for (int i = 0; i < count; ++i) {
            std::memcpy(&buffer[static_cast<size_t>(i * kTableCols)], &w[static_cast<size_t>(ids[i] * kTableCols)],
                        kTableCols * sizeof(float));
          }
          MPI_Send(buffer.data(), static_cast<int>(count * kTableCols), MPI_FLOAT, from, kTagReply, MPI_COMM_WORLD);
        }
      } else {  // a push: dense gradient, or ids then rows
        if (!shape.sparse) {
          MPI_Recv(buffer.data(), static_cast<int>(w.size()), MPI_FLOAT, from, kTagPush, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
          for (size_t i = 0; i < w.size(); ++i) w[i] -= kLearningRate * buffer[i];
        } else {
          int count = 0;
          MPI_Get_count(&status, MPI_INT64_T, &count);
          MPI_Recv(ids.data(), count, MPI_INT64_T, from, kTagPush, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Recv(buffer.data(), static_cast<int>(count * kTableCols), MPI_FLOAT, from, kTagPush, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
          for (int i = 0; i < count; ++i) {
            float* row = &w[static_cast<size_t>(ids[i] * kTableCols)];
            for (int64_t c = 0; c < kTableCols; ++c) row[c] -= kLearningRate * buffer[static_cast<size_t>(i * kTableCols + c)];
          }
        }
      }
    }
  } else {
    const int worker = rank - 1;
    std::vector<float> value(static_cast<size_t>(shape.sparse ? kSparseIds * kTableCols : kDenseElements));
    std::vector<float> grad(value.size(), 1.0f);
    for (int64_t step = 0; step < shape.steps; ++step) {
      std::vector<int64_t> ids = shape.sparse ? ids_of(worker, step) : std::vector<int64_t>{0};
      MPI_Send(ids.data(), static_cast<int>(ids.size()), MPI_INT64_T, kServer, kTagPull, MPI_COMM_WORLD);
      const int n = shape.sparse ? static_cast<int>(ids.size() * kTableCols) : static_cast<int>(value.size());
      MPI_Recv(value.data(), n, MPI_FLOAT, kServer, kTagReply, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (!shape.sparse) {
        MPI_Send(grad.data(), n, MPI_FLOAT, kServer, kTagPush, MPI_COMM_WORLD);
      } else {
        MPI_Send(ids.data(), static_cast<int>(ids.size()), MPI_INT64_T, kServer, kTagPush, MPI_COMM_WORLD);
        MPI_Send(grad.data(), n, MPI_FLOAT, kServer, kTagPush, MPI_COMM_WORLD);
      }
    }
    MPI_Send(nullptr, 0, MPI_BYTE, kServer, kTagDone, MPI_COMM_WORLD);
  }
  double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

// The same steps through ParameterServerStrategy; seconds of the slowest process.
double flowlet_loop(fl::ParameterServerStrategy& ps, const fl::Variable& var, const Shape& shape) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto begin = Clock::now();
  ps.run([] { return std::make_unique<fl::optim::SGD>(kLearningRate); },
         [&](fl::ps::Worker& worker) {
           const fl::Tensor dense_grad = fl::full({kDenseElements}, 1.0f);
           const fl::Tensor sparse_grad = fl::full({kSparseIds, kTableCols}, 1.0f);
           for (int64_t step = 0; step < shape.steps; ++step) {
             if (!shape.sparse) {
               const fl::Tensor value = var.value();
               (void)value;
               worker.apply_gradients({dense_grad}, {var});
             } else {
               const std::vector<int64_t> ids = ids_of(worker.index(), step);
               const fl::Tensor rows = fl::gather(var, fl::tensor(ids, {static_cast<int64_t>(ids.size())}));
               (void)rows;
               worker.apply_gradients({fl::slice(sparse_grad, 0, 0, static_cast<int64_t>(ids.size()))}, {var});
             }
           }
         });
  double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  // flowlet starts MPI with its first communicator across processes (and finalizes it at exit);
  // the raw loop's MPI calls come after that.
  if (fl::process_count() < 2) {
    fmt::print("run under mpirun with >= 2 processes (1 server + workers), e.g. mpirun -np 4 bench_ps_updates\n");
    return 1;
  }
  fl::barrier();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int workers = size - 1;
  {
    fl::ParameterServerOptions options;
    options.num_servers = 1;
    options.mode = fl::TrainingMode::async;
    options.sharding.min_bytes_to_split = int64_t{1} << 40;  // whole on the one server
    fl::ParameterServerStrategy ps(options);
    fl::Variable dense, table;
    {
      auto scope = ps.scope();
      dense = fl::Variable(fl::full({kDenseElements}, 0.5f), "dense");
      table = fl::Variable(fl::full({kTableRows, kTableCols}, 0.5f), "table");
    }
    if (rank == 0) {
      fmt::print("parameter-server updates/s, 1 server + {} workers over MPI (median of {})\n", workers, kRepetitions);
      fmt::print("{:<44} {:>12} {:>12} {:>8}\n", "exchange", "raw MPI", "flowlet", "ratio");
    }
    for (const Shape shape : {Shape{false, 40}, Shape{true, 2000}}) {
      const fl::Variable& var = shape.sparse ? table : dense;
      (void)raw_loop(shape, rank, workers);  // warm-up: connections, allocations
      (void)flowlet_loop(ps, var, shape);
      std::vector<double> raw, ours;
      for (int r = 0; r < kRepetitions; ++r) {
        raw.push_back(raw_loop(shape, rank, workers));
        ours.push_back(flowlet_loop(ps, var, shape));
      }
      const double updates = static_cast<double>(shape.steps * workers);
      const double raw_rate = updates / median(raw), our_rate = updates / median(ours);
      if (rank == 0) {
        fmt::print("{:<44} {:>12.0f} {:>12.0f} {:>8.2f}\n",
                   shape.sparse ? "sparse: 128 rows x 64 of a 100k x 64 table" : "dense: 4 MB pull + 4 MB push",
                   raw_rate, our_rate, our_rate / raw_rate);
      }
    }
  }
  return 0;
}
