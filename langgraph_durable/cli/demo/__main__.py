import sys

from langgraph_durable.cli.demo.worker import main

sys.exit(main())
