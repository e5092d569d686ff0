import sys

from tessera_cli.main import main

sys.exit(main())
