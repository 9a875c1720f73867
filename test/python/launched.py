"""What launched a rank of the multi-rank suites, mpirun or torchrun (without torch: the NumPy
suite imports it too)."""
import os


def torchrun():
    """Whether torchrun (or another env:// launcher) started this rank, not mpirun."""
    return "OMPI_COMM_WORLD_SIZE" not in os.environ and "WORLD_SIZE" in os.environ


def launched_rank_and_size():
    """This rank and the world's size as the launcher gave them."""
    if torchrun():
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])


def job_id():
    """This job's name, which no job running at the same time shares: torchrun's run id, Open
    MPI 4's OMPI_MCA_ess_base_jobid, Open MPI 5's PMIX_NAMESPACE."""
    return (os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("OMPI_MCA_ess_base_jobid")
            or os.environ.get("PMIX_NAMESPACE", "0"))
