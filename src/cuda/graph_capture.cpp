// Recording CUDA Graphs (core/backend.hpp's RecordedGraph), and value += scale * update in place,
// which keeps a variable's buffer where a recording saw it (copy_in_place is copy.cpp's).
#include <vector>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "cuda/allocator.hpp"
#include "cuda/capture_pool.hpp"
#include "cuda/check.hpp"
#include "cuda/runtime.hpp"

namespace flowlet::detail::cuda {
namespace {

// Each phase is recorded from a stream of its own (capture needs a stream nobody else uses: the
// compute stream carries other threads' eager work) with a cuBLAS handle bound to it. Relaxed mode:
// a kernel that would synchronize on the recording stream still fails the recording (that call
// conflicts with capture in every mode), while a library's own set-up calls on first use (cuBLAS
// on a new handle) are tolerated; flowlet's kernels make no synchronous copies or allocations
// outside the pool. The handle gets a fixed workspace, so cuBLAS allocates nothing while recording
// (otherwise it would put allocation nodes in the graph). Replays launch on the compute stream,
// ordered with everything else on the device.
// cuBLAS's recommended workspace on Hopper (its documentation of cublasSetWorkspace); ample before.
constexpr size_t kBlasWorkspace = size_t{32} << 20;

class CudaRecordedGraph final : public RecordedGraph {
 public:
  explicit CudaRecordedGraph(int device) : device_(device), pool_(device) {
    use_device(device_);
    (void)stream(device_);  // the device's state exists before anything is recorded
    FLOWLET_CUDA_CHECK(device_, cudaStreamCreateWithFlags(&streams_.stream, cudaStreamNonBlocking));
    streams_.device = device_;
    FLOWLET_CUDA_CHECK(device_, cublasCreate(&streams_.blas));
    FLOWLET_CUDA_CHECK(device_, cublasSetStream(streams_.blas, streams_.stream));
    workspace_ = allocate_block(device_, kBlasWorkspace);
    FLOWLET_CUDA_CHECK(device_, cublasSetWorkspace(streams_.blas, workspace_, kBlasWorkspace));
    pool_.start();
  }

  ~CudaRecordedGraph() override {
    if (capturing_) abandon_phase();
    pool_.stop();
    // Launches may still run: wait for them before the graphs and their memory go.
    use_device(device_);
    cudaStreamSynchronize(stream(device_));
    for (cudaGraphExec_t exec : execs_) cudaGraphExecDestroy(exec);
    for (cudaGraph_t graph : graphs_) cudaGraphDestroy(graph);
    if (streams_.blas) cublasDestroy(streams_.blas);
    if (streams_.stream) cudaStreamDestroy(streams_.stream);
    cudaGetLastError();  // nothing to report from a destructor
    if (workspace_) free_block(device_, workspace_, kBlasWorkspace);
    pool_.release();
  }

  void begin_phase() override {
    use_device(device_);
    FLOWLET_CUDA_CHECK(device_, cudaStreamBeginCapture(streams_.stream, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    set_recording_streams(&streams_);
  }

  void end_phase() override {
    set_recording_streams(nullptr);
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    use_device(device_);
    const cudaError_t ended = cudaStreamEndCapture(streams_.stream, &graph);
    if (ended != cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    FLOWLET_CUDA_CHECK(device_, ended);
    graphs_.push_back(graph);
    cudaGraphExec_t exec = nullptr;
    // Should a library still allocate inside the graph, its memory is freed before each relaunch.
    FLOWLET_CUDA_CHECK(device_, cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    execs_.push_back(exec);
  }

  void stop() override { pool_.stop(); }

  int phases() const override { return static_cast<int>(execs_.size()); }

  void launch(int phase) override {
    use_device(device_);
    FLOWLET_CUDA_CHECK(device_, cudaGraphLaunch(execs_.at(static_cast<size_t>(phase)), stream(device_)));
  }

 private:
  // Ends a capture that failed half-way: the partial graph is thrown away.
  void abandon_phase() noexcept {
    set_recording_streams(nullptr);
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(streams_.stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
  }

  int device_;
  CapturePool pool_;
  RecordingStreams streams_;
  void* workspace_ = nullptr;  // the recording handle's cuBLAS workspace, used by every replay
  bool capturing_ = false;
  std::vector<cudaGraph_t> graphs_;
  std::vector<cudaGraphExec_t> execs_;
};

}  // namespace

std::unique_ptr<RecordedGraph> start_recording(int device) { return std::make_unique<CudaRecordedGraph>(device); }

void add_scaled_in_place(const Tensor& value, const Tensor& update, double scale) {
  const Launch on = launch_on(value.device());
  launch_axpy(value.raw_data(), update.raw_data(), value.numel(), element_type(value.dtype()), scale, on);
}

}  // namespace flowlet::detail::cuda
