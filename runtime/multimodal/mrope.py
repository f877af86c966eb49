"""M-RoPE's positions (Qwen2-VL, Qwen2.5-VL): each token rotates by three positions, time, row and column. A
text token's three are equal: its index, shifted past the pictures before it; a picture's tokens count from
where it starts (its first token's text position), time by frame, row and column by their place in its grid of
merged patches, and the text after it resumes at that start plus the grid's longer side. So positions run behind
indices by a shift that each picture adds to, and a generated token's position is its index plus the prompt's
whole shift."""

import bisect

from runtime.multimodal.inputs import ImageInput


class MRopeLayout:
    def __init__(self, images: tuple[ImageInput, ...], grids: list[tuple[int, int, int]]):
        """`grids`: each picture's (frames, rows, columns) of merged patches."""
        self.offsets = [image.offset for image in images]
        self.ends = [image.end for image in images]
        self.grids = grids
        self.starts, self.shifts_after = [], []
        shift = 0
        for image, (_, rows, columns) in zip(images, grids):
            self.starts.append(image.offset + shift)
            shift += max(rows, columns) - image.length
            self.shifts_after.append(shift)

    @classmethod
    def of(cls, images: tuple[ImageInput, ...], merge: int) -> "MRopeLayout":
        """From the pictures' `image_grid_thw` (patches; `merge` x `merge` of them make a token)."""
        grids = []
        for image in images:
            t, h, w = image.tensors["image_grid_thw"].view(-1).tolist()
            grids.append((t, h // merge, w // merge))
        return cls(images, grids)

    def positions(self, start: int, end: int) -> tuple[list[int], list[int], list[int]]:
        """The time, row and column positions of the tokens at indices [start, end)."""
        times, rows, columns = [], [], []
        for p in range(start, end):
            k = bisect.bisect_right(self.offsets, p) - 1
            if k >= 0 and p < self.ends[k]:
                _, height, width = self.grids[k]
                local, first = p - self.offsets[k], self.starts[k]
                times.append(first + local // (height * width))
                rows.append(first + local // width % height)
                columns.append(first + local % width)
            else:
                q = p + (self.shifts_after[k] if k >= 0 else 0)
                times.append(q)
                rows.append(q)
                columns.append(q)
        return times, rows, columns

