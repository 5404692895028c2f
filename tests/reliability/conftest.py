"""The tuner's fakes (tests/tune/tune_fakes.py) for the journal and lock tests."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tune"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
