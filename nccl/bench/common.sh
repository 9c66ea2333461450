# The opening every nccl/bench/run-*.sh shares, sourced with CARRY and OUT as $1 and $2: the
# no-multicast switches, the library carried, the NCCL inside the PyTorch install (which nccl-tests
# builds against), a logs folder, and nccl-tests built there from the source carried.
set -uo pipefail
carry=$(realpath "$1") out=$2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
library=$carry/libpeerlink_nccl.so
nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')
# nccl-tests links -lnccl; the wheel ships only libnccl.so.2.
home=/tmp/ncclhome && mkdir -p $home/lib && ln -sf "$nccl/include" $home/include
ln -sf "$nccl/lib/libnccl.so.2" $home/lib/libnccl.so.2 && ln -sf "$nccl/lib/libnccl.so.2" $home/lib/libnccl.so
logs=/tmp/logs && mkdir -p $logs
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.nccl.version())'
  echo "NCCL: $nccl"; } >$logs/machine.txt 2>&1
cp -r "$carry/nccl-tests" /tmp/nccl-tests
(cd /tmp/nccl-tests && time make -j16 CUDA_HOME=/usr/local/cuda NCCL_HOME=$home \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90") >$logs/build.log 2>&1 || tail -30 $logs/build.log
export LD_LIBRARY_PATH=$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
