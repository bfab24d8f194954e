"""The success classifier's command: it trains on a folder of labelled frames, says how
well it tells them apart (on frames it learnt from and on frames held out), saves what
`env.real_robot.success_classifier` loads, and names what is wrong with a bad folder."""

import numpy as np
from PIL import Image

from trainer.__main__ import main
from trainer.envs.success_classifier import load_classifier


def pictures(folder, where: str, count: int) -> None:
    """A bright square in the top-left corner (`where` "corner") or elsewhere: a scene's
    layout, not its colour, tells success from failure."""
    folder.mkdir(parents=True)
    generator = np.random.default_rng(len(where) + count)
    for index in range(count):
        picture = generator.integers(0, 60, (40, 40, 3), dtype=np.uint8)
        y, x = (2, 2) if where == "corner" else generator.integers(18, 28, 2)
        picture[y : y + 10, x : x + 10] = 255
        Image.fromarray(picture).save(folder / f"{index}.jpg", quality=95)


def test_train_classifier_learns_labelled_frames_and_saves_what_the_env_loads(tmp_path, capsys):
    pictures(tmp_path / "frames" / "success", "corner", 20)
    pictures(tmp_path / "frames" / "failure", "elsewhere", 40)
    out = tmp_path / "classifier.pt"
    code = main(["train-classifier", str(tmp_path / "frames"), "--out", str(out),
                 "--image-size", "24", "--epochs", "40"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.startswith("20 success and 40 failure frames: accuracy 1.000")
    assert "1.000 on those held out" in printed
    model, threshold = load_classifier(out)
    assert threshold == 0.5 and model.image_size == 24
    corner = np.zeros((40, 40, 3), dtype=np.uint8)
    corner[2:12, 2:12] = 255
    middle = np.zeros((40, 40, 3), dtype=np.uint8)
    middle[20:30, 20:30] = 255
    probability = model.success_probability([corner, middle])
    assert probability[0] > 0.5 > probability[1]


def test_a_folder_without_failures_or_a_bad_threshold_is_named(tmp_path, capsys):
    pictures(tmp_path / "frames" / "success", "corner", 4)
    out = str(tmp_path / "c.pt")
    assert main(["train-classifier", str(tmp_path / "frames"), "--out", out]) == 2
    assert "frames/failure: no pictures" in capsys.readouterr().err
    assert main(["train-classifier", str(tmp_path / "frames"), "--out", out,
                 "--threshold", "1.5"]) == 2  # fmt: skip
    assert "--threshold: must be between 0 and 1" in capsys.readouterr().err
