// MPI's life in a flowlet process.
//
// Start: MPI is initialized (MPI_Init_thread, MPI_THREAD_MULTIPLE required: every cross-process
// communicator has its own progress thread) by the first communicator that spans more than one
// process, never before: a plain run, or a 1-process launch, never touches MPI. A program that
// initialized MPI itself keeps it; flowlet then neither initializes nor finalizes it. When flowlet
// starts Open MPI it selects libnbc's ring algorithm for MPI_Iallreduce (setting
// OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 unless already set): measured faster than the default.
//
// End: when flowlet initialized MPI it installs, at that moment, an exit handler (std::atexit) that
// shuts down every cross-process communicator still alive (the world communicator is one: it lives
// until exit) and then calls MPI_Finalize, exactly once. Because the handler is registered after
// the static objects that existed before MPI started, it runs before their destructors; a
// communicator destroyed after it finds MPI gone and only releases memory.
//
// Failure: a job must never hang because one process failed. flowlet installs a terminate handler
// that calls MPI_Abort (an uncaught exception on any thread ends the whole job, non-zero), and a
// communicator destroyed while one of its calls is still in flight aborts the job as well (its
// peers would otherwise wait for it until their timeout). A process killed by a signal is noticed
// by the launcher (mpirun), which ends the job.
#pragma once

#include <functional>
#include <string>

namespace flowlet::detail {

class MpiCommunicator;

// Initializes MPI once (see above). InvalidArgument when the MPI library cannot provide
// MPI_THREAD_MULTIPLE or its world size differs from the launcher's process count.
void ensure_mpi_started();

// False once the exit handler ran MPI_Finalize (or a program that owns MPI finalized it).
bool mpi_usable();

// Prints `why` (with this process's index) to stderr and ends the whole job with MPI_Abort.
[[noreturn]] void abort_job(const std::string& why);

// The communicators the exit handler must shut down.
void register_live_communicator(MpiCommunicator* communicator);
void unregister_live_communicator(MpiCommunicator* communicator);

// Anything else that uses MPI until it is destroyed (the parameter servers' transport) registers a
// hook that shuts it down; the exit handler runs the hooks still registered, in registration
// order, before it shuts down the communicators and finalizes MPI. A hook may unregister itself.
// register_exit_hook returns the id to unregister with.
int register_exit_hook(std::function<void()> hook);
void unregister_exit_hook(int id);

}  // namespace flowlet::detail
