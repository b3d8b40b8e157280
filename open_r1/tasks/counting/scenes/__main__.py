"""``python -m open_r1.tasks.counting.scenes --out data --train 2000 ...``: see open_r1/tasks/counting/scenes/cli.py."""

from open_r1.tasks.counting.scenes.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
