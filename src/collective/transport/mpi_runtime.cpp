#include "collective/transport/mpi_runtime.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <set>

#include "collective/transport/backends.hpp"
#include "collective/transport/mpi_communicator.hpp"
#include "collective/transport/mpi_include.hpp"
#include "collective/transport/process.hpp"
#include "flowlet/core/error.hpp"

namespace flowlet::detail {

namespace {

std::mutex& live_mutex() {
  static std::mutex* mutex = new std::mutex;  // never destroyed: used by the exit handler
  return *mutex;
}
std::set<MpiCommunicator*>& live() {
  static auto* communicators = new std::set<MpiCommunicator*>;
  return *communicators;
}

// Exit hooks by id (ids grow, so the map's order is the registration order).
std::map<int, std::function<void()>>& exit_hooks() {
  static auto* hooks = new std::map<int, std::function<void()>>;
  return *hooks;
}
int next_exit_hook = 0;  // under live_mutex()

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

void terminate_with_abort() {
  std::string what = "an unknown exception";
  if (std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
  } else {
    what = "std::terminate without an exception";
  }
  abort_job(fmt::format("terminate called ({})", what));
}

void finalize_at_exit() {
  std::map<int, std::function<void()>> hooks;
  {
    std::lock_guard lock(live_mutex());
    hooks = exit_hooks();
  }
  for (auto& [id, hook] : hooks) hook();  // unlocked: a hook unregisters itself
  std::set<MpiCommunicator*> communicators;
  {
    std::lock_guard lock(live_mutex());
    communicators = live();
  }
  for (MpiCommunicator* communicator : communicators) communicator->begin_shut_down();
  for (MpiCommunicator* communicator : communicators) communicator->end_shut_down();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Finalize();
  }
}

}  // namespace

void ensure_mpi_started() {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Open MPI's default nonblocking all-reduce (libnbc's own choice) runs at about 0.6x the
    // blocking MPI_Allreduce from 256 KB up on one machine; its ring algorithm matches or beats it
    // there (benchmarks/collective/bench_all_reduce). Chosen unless the user chose otherwise; it
    // only applies when flowlet starts MPI.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      throw InvalidArgument("make_communicator: MPI_Init_thread failed");
    }
    std::atexit(finalize_at_exit);
  }
  static const bool terminate_installed = [] {
    std::set_terminate(terminate_with_abort);
    return true;
  }();
  (void)terminate_installed;
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    throw InvalidArgument(fmt::format(
        "make_communicator: flowlet needs MPI_THREAD_MULTIPLE (every communicator has its own progress thread); "
        "this MPI library provides only {}",
        thread_level_name(provided)));
  }
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size != process_placement().count) {
    throw InvalidArgument(fmt::format("make_communicator: the launcher ({}) says {} processes, MPI_COMM_WORLD has {}",
                                      process_placement().source, process_placement().count, world_size));
  }
}

bool mpi_started() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

bool mpi_usable() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void abort_job(const std::string& why) {
  std::fprintf(stderr, "flowlet: process %d of %d: %s; aborting the job\n", process_placement().index,
               process_placement().count, why.c_str());
  std::fflush(stderr);
  if (mpi_usable()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void register_live_communicator(MpiCommunicator* communicator) {
  std::lock_guard lock(live_mutex());
  live().insert(communicator);
}

void unregister_live_communicator(MpiCommunicator* communicator) {
  std::lock_guard lock(live_mutex());
  live().erase(communicator);
}

int register_exit_hook(std::function<void()> hook) {
  std::lock_guard lock(live_mutex());
  const int id = next_exit_hook++;
  exit_hooks().emplace(id, std::move(hook));
  return id;
}

void unregister_exit_hook(int id) {
  std::lock_guard lock(live_mutex());
  exit_hooks().erase(id);
}

}  // namespace flowlet::detail
