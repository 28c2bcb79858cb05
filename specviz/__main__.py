import sys

if sys.argv[1:2] == ["gpu-check"]:  # a bare GPU machine (torch + transformers): not the whole CLI's imports
    from .cli.gpu_check import main as gpu_check
    sys.exit(gpu_check(sys.argv[2:]))

from .cli.main import main  # noqa: E402

sys.exit(main())
