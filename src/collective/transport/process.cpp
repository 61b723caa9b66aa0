#include "collective/transport/process.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <optional>

#include "flowlet/collective.hpp"
#include "flowlet/core/error.hpp"

namespace flowlet::detail {

namespace {

std::optional<int> read_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0 || value > (1 << 30)) {
    throw InvalidArgument(
        fmt::format("process_index: the launcher's {} is not a process number; got '{}'", name, text));
  }
  return static_cast<int>(value);
}

struct Launcher {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
};

constexpr Launcher kLaunchers[] = {
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"MPICH (Hydra)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

}  // namespace

ProcessPlacement placement_from_environment() {
  for (const Launcher& launcher : kLaunchers) {
    const auto rank = read_int(launcher.rank);
    const auto size = read_int(launcher.size);
    if (!rank || !size) continue;
    const auto local = read_int(launcher.local_rank);
    if (*size < 1 || *rank >= *size) {
      throw InvalidArgument(
          fmt::format("process_index: {} says process {} of {} ({}, {}); that is not a process of "
                      "the job",
                      launcher.name, *rank, *size, launcher.rank, launcher.size));
    }
    return ProcessPlacement{*rank, *size, local.value_or(0), launcher.name};
  }
  return ProcessPlacement{0, 1, 0, "none"};
}

const ProcessPlacement& process_placement() {
  static const ProcessPlacement placement = placement_from_environment();
  return placement;
}

}  // namespace flowlet::detail

namespace flowlet {

int process_index() { return detail::process_placement().index; }
int process_count() { return detail::process_placement().count; }
int local_process_index() { return detail::process_placement().local_index; }

}  // namespace flowlet
