"""docs/stacks.md shows the shipped stacks as the code derives them."""

from infra.config.stack_files import PROJECT_ROOT
from infra.stack_table import markdown_table, training_table


def test_docs_table_matches_the_stacks():
    table = markdown_table()
    assert "| multislice | standard | 2 x v6e 2x4 | 16 | 4 | 2 pools of 2 x ct6e-standard-4t |" in table
    assert table in (PROJECT_ROOT / "docs" / "stacks.md").read_text(), "run `python -m infra.stack_table` and paste it into docs/stacks.md"


def test_docs_table_of_training_keys_is_the_trainers():
    table = training_table()
    assert "| `gemma-tpu:training.learningRate` | 2e-05 | `--lr` |" in table
    assert table in (PROJECT_ROOT / "docs" / "stacks.md").read_text(), (
        "run `python -m infra.stack_table --training` and paste it into docs/stacks.md"
    )
