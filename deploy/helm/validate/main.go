// Command validate decodes rendered Kubernetes manifests strictly: built-in kinds into the real
// API types of k8s.io/api (unknown or duplicate fields refused), custom resources against the
// openAPIV3Schema of their CustomResourceDefinition, the way an API server does (unknown fields
// that it would prune refused, then the schema's validation).
//
//	validate -crds DIR MANIFESTS.yaml...
//
// DIR holds CRD YAML files (KEDA's, Strimzi's, Prometheus Operator's). Prints one line per
// object; exits 1 if any object fails.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

type crdVersion struct {
	validator  validation.SchemaCreateValidator
	structural *structuralschema.Structural
}

func builtins() (*runtime.Scheme, runtime.Decoder) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, policyv1.AddToScheme,
		apiextensionsv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	strict := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
	return scheme, strict
}

func documents(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var docs [][]byte
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
}

func stripComments(doc []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out = append(out, line)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

// loadCRDs reads every CRD in dir: group/version/kind -> its schema, validator and structure.
func loadCRDs(dir string, decoder runtime.Decoder) (map[schema.GroupVersionKind]crdVersion, error) {
	crds := map[schema.GroupVersionKind]crdVersion{}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	for _, file := range files {
		docs, err := documents(file)
		if err != nil {
			return nil, err
		}
		for _, doc := range docs {
			obj, _, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
			if !ok {
				continue
			}
			for _, v := range crd.Spec.Versions {
				if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
					return nil, fmt.Errorf("%s: %s %s has no schema", file, crd.Name, v.Name)
				}
				internal := &apiextensions.JSONSchemaProps{}
				if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(
					v.Schema.OpenAPIV3Schema, internal, nil); err != nil {
					return nil, err
				}
				structural, err := structuralschema.NewStructural(internal)
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", file, crd.Name, err)
				}
				validator, _, err := validation.NewSchemaValidator(internal)
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", file, crd.Name, err)
				}
				gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name,
					Kind: crd.Spec.Names.Kind}
				crds[gvk] = crdVersion{validator: validator, structural: structural}
			}
		}
	}
	return crds, nil
}

func checkCustom(doc []byte, crd crdVersion) []string {
	raw, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return []string{err.Error()}
	}
	var obj map[string]interface{}
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		return []string{err.Error()}
	}
	var problems []string
	opts := structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}
	for _, path := range pruning.PruneWithOptions(obj, crd.structural, true, opts) {
		problems = append(problems, "unknown field "+path)
	}
	for _, e := range validation.ValidateCustomResource(field.NewPath(""), obj, crd.validator) {
		problems = append(problems, e.Error())
	}
	return problems
}

func main() {
	crdDir := flag.String("crds", "", "directory of CustomResourceDefinition YAML files")
	flag.Parse()
	scheme, decoder := builtins()
	crds, err := loadCRDs(*crdDir, decoder)
	if err != nil {
		fmt.Fprintln(os.Stderr, "validate:", err)
		os.Exit(2)
	}
	failed := 0
	for _, path := range flag.Args() {
		docs, err := documents(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "validate:", err)
			os.Exit(2)
		}
		for _, doc := range docs {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal(doc, &head); err != nil {
				fmt.Printf("FAIL ?: %v\n", err)
				failed++
				continue
			}
			gvk := schema.FromAPIVersionAndKind(head.APIVersion, head.Kind)
			what := fmt.Sprintf("%s %s/%s", head.APIVersion, head.Kind, head.Metadata.Name)
			var problems []string
			if scheme.Recognizes(gvk) {
				if _, _, err := decoder.Decode(doc, nil, nil); err != nil {
					problems = append(problems, err.Error())
				}
			} else if crd, ok := crds[gvk]; ok {
				problems = checkCustom(doc, crd)
			} else {
				problems = append(problems, "no API type or CRD for "+gvk.String())
			}
			if len(problems) > 0 {
				failed++
				fmt.Printf("FAIL %s: %s\n", what, strings.Join(problems, "; "))
			} else {
				fmt.Printf("ok %s\n", what)
			}
		}
	}
	if failed > 0 {
		os.Exit(1)
	}
}
